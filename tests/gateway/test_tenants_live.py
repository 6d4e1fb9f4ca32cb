"""Tenants through a real gateway in front of one real replica (one gateway for the whole file).

Four tenants with their own keys: `alpha` (3 requests a minute, admin), `beta` (no limits, one
model allowed), `gamma` (a TPM limit that streamed output exhausts) and `delta` (a daily token
budget; the gateway's wall clock is the test's, so "tomorrow" is a step of it). Every usage a
client receives is summed here and must equal what /admin/usage reports; after the gateway
stopped (as on SIGTERM), a new ledger on the same database still holds it and the budgets.
No key is in any log line (the gateway's and the replica's), in /metrics or in /admin answers.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict

import httpx
import pytest
import yaml

from tandem.deployment.tenants import hash_key, load_tenants, parse_tenants
from tandem.gateway.ledger import Ledger
from tandem.gateway.tenant_app import enable_tenancy

from .harness import MODEL_NAME, RunningGateway, variant

pytestmark = pytest.mark.slow

KEYS = {name: f"tdm-test-key-of-{name}-0123456789" for name in ("alpha", "beta", "gamma", "delta")}
TENANTS = {
    "tenants": [
        {"name": "alpha", "keys": [hash_key(KEYS["alpha"])], "limits": {"rpm": 3}, "admin": True},
        {"name": "beta", "keys": [hash_key(KEYS["beta"])], "priority": "batch", "models": [MODEL_NAME]},
        {"name": "gamma", "keys": [hash_key(KEYS["gamma"])], "limits": {"tpm": 40}},
        {"name": "delta", "keys": [hash_key(KEYS["delta"])], "budget": {"tokens_per_day": 30}},
    ],
    "fairness": {"max_inflight_per_replica": 4},
}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class Clients:
    """Calls as each tenant, summing the `usage` every answer carried."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.usage: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.lock = threading.Lock()

    def post(self, tenant: str, stream: bool = False, max_tokens: int = 8, **body) -> httpx.Response:
        payload = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": max_tokens, **body}
        if stream:
            payload |= {"stream": True, "stream_options": {"include_usage": True}}
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"} if tenant in KEYS else {}
        r = httpx.post(self.url + "/v1/completions", json=payload, headers=headers, timeout=60)
        if r.status_code == 200:
            usage = (
                next(json.loads(line[5:])["usage"] for line in r.text.splitlines() if '"usage": {' in line
                     or '"usage":{' in line)
                if stream else r.json()["usage"]
            )  # fmt: skip
            with self.lock:
                self.usage[tenant][0] += usage["prompt_tokens"]
                self.usage[tenant][1] += usage["completion_tokens"]
        return r


@pytest.fixture(scope="module")
def live(serve_model_dir, tmp_path_factory):
    lines = Lines()
    logging.getLogger().addHandler(lines)
    root = tmp_path_factory.mktemp("tenants")
    offset = [0.0]  # the gateway's wall clock is the test's: offset[0] seconds ahead of real time

    (root / "tenants.yaml").write_text(yaml.safe_dump(TENANTS))

    def prepare(gw):
        ledger = Ledger(root / "usage.db", flush_interval_s=0.2)
        tenants = load_tenants(root / "tenants.yaml")
        enable_tenancy(gw, tenants, ledger, path=root / "tenants.yaml", wall=lambda: time.time() + offset[0])

    raw = {"model": str(serve_model_dir), "threads": 1, "variants": [variant("fast")], "policy": {"name": "hpa"}}
    gw = RunningGateway(raw, root / "logs", prepare=prepare)
    try:
        gw.wait_ready("fast")
        yield gw, Clients(gw.url), offset, lines, root
    finally:
        gw.stop()
        logging.getLogger().removeHandler(lines)


def test_an_unknown_or_missing_key_is_401(live):
    gw, clients, *_ = live
    assert clients.post("nobody").status_code == 401
    r = httpx.post(gw.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "x"},
                   headers={"Authorization": "Bearer tdm-wrong"}, timeout=30)  # fmt: skip
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(gw.url + "/admin/usage", headers={"Authorization": f"Bearer {KEYS['beta']}"}, timeout=30)
    assert r.status_code == 403  # beta is no admin


def test_a_tenant_over_its_rpm_gets_429_while_another_is_served(live):
    _, clients, *_ = live
    answers = [clients.post("alpha") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert answers[-1].headers["x-ratelimit-limit-requests"] == "3"
    assert answers[-1].headers["x-ratelimit-remaining-requests"] == "0"
    refused = clients.post("alpha")
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error" and "rpm" in error["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 20
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    assert clients.post("beta").status_code == 200  # the other tenant is served meanwhile


def test_tpm_counts_streamed_output(live):
    _, clients, *_ = live
    first = clients.post("gamma", stream=True, max_tokens=48, ignore_eos=True)  # a prompt of ~4, well under 40
    assert first.status_code == 200 and clients.usage["gamma"][1] == 48
    refused = clients.post("gamma", max_tokens=1)  # the 48 streamed tokens took the bucket below zero
    assert refused.status_code == 429 and "tpm" in refused.json()["error"]["message"]
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"


def test_a_budget_stops_a_tenant_until_the_next_day(live):
    _, clients, offset, *_ = live
    assert clients.post("delta", max_tokens=40, ignore_eos=True).status_code == 200
    refused = clients.post("delta")
    assert refused.status_code == 429 and "tokens_per_day" in refused.json()["error"]["message"]
    now = time.time() + offset[0]
    assert abs(int(refused.headers["Retry-After"]) - (86400 - now % 86400)) < 5  # until 00:00 UTC
    offset[0] += 86400 - now % 86400 + 1  # the gateway's clock: tomorrow
    assert clients.post("delta").status_code == 200


def test_reload_takes_a_good_file_and_keeps_the_old_tenants_on_a_bad_one(live):
    gw, clients, _, _, root = live
    alpha = {"Authorization": f"Bearer {KEYS['alpha']}"}
    (root / "tenants.yaml").write_text("tenants:\n  - name: x\n    keys: [not-a-hash]\n")
    r = httpx.post(gw.url + "/admin/tenants/reload", headers=alpha, timeout=30)
    assert r.status_code == 400 and "tenants.0.keys.0" in r.json()["error"]["message"], r.text
    assert clients.post("beta").status_code == 200  # the old tenants still hold
    KEYS["epsilon"] = "tdm-test-key-of-epsilon-0123456789"
    grown = {**TENANTS, "tenants": [*TENANTS["tenants"], {"name": "epsilon", "keys": [hash_key(KEYS["epsilon"])]}]}
    (root / "tenants.yaml").write_text(yaml.safe_dump(grown))
    r = httpx.post(gw.url + "/admin/tenants/reload", headers=alpha, timeout=30)
    assert r.status_code == 200 and "epsilon" in [t["name"] for t in r.json()["tenants"]]
    assert clients.post("epsilon").status_code == 200


def test_the_model_allow_list_names_the_model(live):
    _, clients, *_ = live
    r = clients.post("beta", model="someone-elses-model")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert "someone-elses-model" in r.json()["error"]["message"]


def test_admin_usage_equals_what_the_clients_received_and_no_key_is_shown_or_logged(live):
    gw, clients, _, lines, _root = live
    alpha = {"Authorization": f"Bearer {KEYS['alpha']}"}
    for _ in range(3):
        assert clients.post("beta", stream=True).status_code == 200
    usage = httpx.get(gw.url + "/admin/usage", params={"group_by": "day"}, headers=alpha, timeout=30).json()
    got: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in usage["rows"]:
        got[row["tenant"]][0] += row["prompt_tokens"]
        got[row["tenant"]][1] += row["completion_tokens"]
    for tenant, (prompt, completion) in clients.usage.items():
        assert got[tenant] == [prompt, completion], (tenant, dict(got), dict(clients.usage))
    statuses = defaultdict(int)
    for row in usage["rows"]:
        if row["tenant"] == "alpha":
            for code, n in row["requests_by_status"].items():
                statuses[code] += n
    assert statuses["200"] == 3 and statuses["429"] == 1  # the refusal is on its bill too
    # Replica time is settled once a second (tenant_app.SETTLE_EVERY_S) and flushed every 0.2 s: the
    # seconds of beta's requests reach the ledger within a few seconds of their end, not at once.
    deadline = time.monotonic() + 15

    def billed(rows: list[dict]) -> bool:
        return any(row["replica_seconds"] > 0 and row["dollars"] > 0 for row in rows if row["tenant"] == "beta")

    while not billed(usage["rows"]):
        assert time.monotonic() < deadline, usage["rows"]
        time.sleep(0.25)
        usage = httpx.get(gw.url + "/admin/usage", params={"group_by": "day"}, headers=alpha, timeout=30).json()
    beta = httpx.get(gw.url + "/admin/usage", params={"tenant": "beta"}, headers=alpha, timeout=30).json()
    assert {row["tenant"] for row in beta["rows"]} == {"beta"}
    shown = httpx.get(gw.url + "/admin/tenants", headers=alpha, timeout=30).text
    metrics = gw.metrics()
    assert 'tandem:tenant_tokens_total{kind="completion",model="tiny",tenant="beta"}' in metrics
    logs = "\n".join(lines.lines) + gw.logs()
    for key in KEYS.values():
        assert key not in shown and key not in metrics and key not in logs
    assert hash_key(KEYS["alpha"])[:19] in shown and hash_key(KEYS["alpha"]) not in shown  # a prefix only


def test_after_the_gateway_stops_the_usage_and_the_budgets_are_still_there(live):
    gw, clients, offset, _, root = live
    before = httpx.get(
        gw.url + "/admin/usage", headers={"Authorization": f"Bearer {KEYS['alpha']}"}, timeout=30
    ).json()["rows"]
    gw.stop()  # as SIGTERM does: the lifespan's shutdown settles replica time and flushes the ledger
    again = Ledger(root / "usage.db")
    after = again.query()
    assert sum(r["completion_tokens"] for r in after) == sum(r["completion_tokens"] for r in before)
    assert sum(r["requests"] for r in after) == sum(r["requests"] for r in before)
    # A gateway started again on this ledger remembers today's spend: delta's budget, used tomorrow.
    from tandem.gateway.tenancy import Limiter, Tenancy

    tenancy = Tenancy(parse_tenants(TENANTS), again, Limiter(lambda: time.time() + offset[0]))
    tenancy.restore_today()
    today = tenancy.limiter.states["delta"].tokens_today  # tomorrow's one request (yesterday's 40+ are not today's)
    assert 0 < today < 30 and tenancy.limiter.admit(tenancy.tenants.get("delta"), 1).allowed
    again.close()
