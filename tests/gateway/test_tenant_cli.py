"""`tandem keys new` and `tandem usage` (table and CSV), and the gateway's tenancy flags' errors."""

import csv
import io

import click
import pytest
from click.testing import CliRunner

from tandem.cli import cli
from tandem.deployment.tenants import hash_key
from tandem.edge.settings import Settings
from tandem.gateway.ledger import Ledger, UsageRecord
from tandem.gateway.tenant_cli import tenancy_from_settings


def test_keys_new_prints_a_key_and_its_hash():
    out = CliRunner().invoke(cli, ["keys", "new"]).output.splitlines()
    key, digest = out[0].removeprefix("key:  "), out[1].removeprefix("hash: ")
    assert key.startswith("tdm-") and digest == hash_key(key)


def test_usage_prints_the_ledger_as_a_table_or_csv(tmp_path):
    ledger = Ledger(tmp_path / "u.db")
    ledger.record(UsageRecord(1_800_000_000, "search", "tiny", "fast", 200, 2, 30, 70, 1.5, 0.002))
    ledger.record(UsageRecord(1_800_000_000, "search", "tiny", "fast", 429, 1))
    ledger.close()
    table = CliRunner().invoke(cli, ["usage", "--db", str(tmp_path / "u.db")])
    assert table.exit_code == 0 and "search" in table.output and "200:2 429:1" in table.output
    out = CliRunner().invoke(cli, ["usage", "--db", str(tmp_path / "u.db"), "--csv", "--group-by", "hour"])
    (row,) = list(csv.DictReader(io.StringIO(out.output)))
    assert row["tenant"] == "search" and row["requests"] == "3" and row["completion_tokens"] == "70"
    assert row["period_start"] == "2027-01-15T08:00Z"
    bad = CliRunner().invoke(cli, ["usage", "--db", str(tmp_path / "u.db"), "--since", "yesterday"])
    assert bad.exit_code != 0 and "ISO 8601" in bad.output


def test_bad_tenancy_settings_are_one_line_errors(tmp_path):
    (tmp_path / "t.yaml").write_text("tenants: [{name: a, keys: [nope]}]")
    with pytest.raises(click.ClickException, match="tenants.0.keys.0"):
        tenancy_from_settings(None, Settings(tenants=str(tmp_path / "t.yaml"), usage_db=str(tmp_path / "u.db")))
    with pytest.raises(click.ClickException, match="not both"):
        tenancy_from_settings(None, Settings(tenants=str(tmp_path / "t.yaml"), api_key="k"))
    with pytest.raises(click.ClickException, match="postgresql"):
        tenancy_from_settings(None, Settings(usage_db="mysql://h/db"))


def test_sighup_reloads_the_tenants_file_and_a_bad_one_keeps_the_old(tmp_path):
    import os
    import signal
    import time

    from tandem.cluster.fake import FakeBackend
    from tandem.deployment import parse_deployment
    from tandem.gateway.wiring import build_gateway

    variants = [{"name": "fast", "recipe": "baseline", "replicas": {"min": 1, "max": 1}}]
    gw = build_gateway(parse_deployment({"variants": variants, "policy": {"name": "hpa"}}), FakeBackend(lambda: 0.0))
    path = tmp_path / "t.yaml"
    path.write_text(f"tenants: [{{name: a, keys: ['{hash_key('ka')}']}}]")
    before = signal.getsignal(signal.SIGHUP)
    try:
        tenancy = tenancy_from_settings(gw, Settings(tenants=str(path), usage_db=str(tmp_path / "u.db")))
        assert gw.tenancy is tenancy and tenancy.tenants.names() == ("a",)
        path.write_text(f"tenants: [{{name: b, keys: ['{hash_key('kb')}']}}]")
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.1)
        assert tenancy.tenants.names() == ("b",) and tenancy.tenants.by_key("kb").name == "b"
        path.write_text("tenants: [{name: c}]")  # no keys: refused, the old tenants stay
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.1)
        assert tenancy.tenants.names() == ("b",)
    finally:
        signal.signal(signal.SIGHUP, before)
        gw.tenancy.ledger.close()
