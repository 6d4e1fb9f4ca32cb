"""The usage ledger on a real PostgreSQL server: the one TANDEM_TEST_POSTGRES_URL names, else one this
file starts with `pgserver` (a self-contained PostgreSQL from the package registry, in the dev extra;
as root it runs the server as its own system user). Skips, saying why, only when no server can start.
Each test has its own database. Two gateways (in process) share one ledger: their rows add up."""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from tandem.gateway.app import create_gateway_app
from tandem.gateway.ledger import Ledger, UsageRecord, ledger_url
from tandem.gateway.tenant_app import enable_tenancy

from .test_ledger import DAY
from .test_tenants_fleet import KEYS, _tenants, gateway

pytest.importorskip("psycopg", reason="the PostgreSQL ledger needs psycopg: pip install 'psycopg[binary]'")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory) -> Iterator[str]:
    """A postgresql:// URL of a server that runs for this file."""
    given = os.environ.get("TANDEM_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        try:
            import pgserver
        except ImportError:
            pytest.skip("no PostgreSQL server: pip install pgserver, or set TANDEM_TEST_POSTGRES_URL")
    try:
        server = pgserver.get_server(tmp_path_factory.mktemp("postgres"), cleanup_mode="stop")
    except Exception as exc:  # noqa: BLE001 (whatever stopped it is the reason to skip)
        pytest.skip(f"pgserver could not start a PostgreSQL server here: {exc.__class__.__name__}: {exc}")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@pytest.fixture
def database(server_url) -> Iterator[str]:
    """A fresh database on the server (dropped after the test)."""
    name = f"tandem_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(ledger_url(server_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        yield sa.make_url(ledger_url(server_url)).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def test_the_ledger_sums_and_queries_on_postgresql(database):
    ledger = Ledger(database, flush_interval_s=0.05)
    assert ledger.engine.dialect.name == "postgresql"
    for at, status in [(DAY + 10, 200), (DAY + 20, 200), (DAY + 3700, 429), (DAY + 86400 + 5, 200)]:
        ledger.record(UsageRecord(at, "a", "m", "v", status, 1, 10, 5 if status == 200 else 0))
    ledger.record(UsageRecord(DAY + 30, "a", "m", "v", 0, replica_seconds=3.0, dollars=0.01))
    ledger.flush()
    days = ledger.query(group_by="day")
    assert [(r["period_start"], r["requests"], r["requests_by_status"]) for r in days] == [
        (DAY, 3, {"200": 2, "429": 1}), (DAY + 86400, 1, {"200": 1})
    ]  # fmt: skip
    assert days[0]["prompt_tokens"] == 30 and days[0]["completion_tokens"] == 10
    assert days[0]["replica_seconds"] == 3.0 and days[0]["dollars"] == pytest.approx(0.01)
    assert len(ledger.query(group_by="hour", since=DAY, until=DAY + 86400)) == 2
    assert ledger.totals_since(DAY + 86400) == [("a", 15, 0.0)]
    ledger.close()
    reopened = Ledger(database)  # another process later: the same sums
    assert reopened.query(group_by="day") == days
    reopened.close()


def test_two_gateways_share_one_postgresql_ledger_and_their_usage_adds_up(database):
    gateways = [gateway(), gateway()]
    ledgers = [Ledger(database, flush_interval_s=0.05) for _ in gateways]
    for gw, ledger in zip(gateways, ledgers, strict=True):
        enable_tenancy(gw, _tenants(), ledger)

    async def serve(gw, calls: list[tuple[str, str]]) -> list[int]:
        app = create_gateway_app(gw)
        for part in gw.parts():
            part.upstream.client = httpx.AsyncClient(transport=part.upstream.transport)
        codes = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            for tenant, model in calls:
                body = {"model": model, "prompt": "hi"}
                headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
                codes.append((await client.post("/v1/completions", json=body, headers=headers)).status_code)
        for part in gw.parts():
            await part.upstream.client.aclose()
        return codes

    assert asyncio.run(serve(gateways[0], [("alpha", "code"), ("beta", "chat"), ("beta", "chat")])) == [200] * 3
    assert asyncio.run(serve(gateways[1], [("alpha", "code"), ("beta", "chat")])) == [200] * 2
    for gw in gateways:  # the replica time too, as each gateway's settlement tick would
        for tenancy in {id(p.tenancy): p.tenancy for p in gw.parts()}.values():
            tenancy.usage.settle()
    for ledger in ledgers:
        ledger.close()
    reader = Ledger(database)
    served = {(r["tenant"], r["model"]): r for r in reader.query() if r["requests_by_status"].get("200")}
    reader.close()
    assert {key: row["requests_by_status"]["200"] for key, row in served.items()} == {
        ("alpha", "code"): 2, ("beta", "chat"): 3
    }  # fmt: skip
    assert served[("beta", "chat")]["prompt_tokens"] == 9 and served[("beta", "chat")]["completion_tokens"] == 15
