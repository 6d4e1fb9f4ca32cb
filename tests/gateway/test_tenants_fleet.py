"""Tenants over a fleet of models, in process (FakeBackend, MockTransport): one set of keys, limits
and one ledger for the gateway; every model's requests are authenticated, limited and billed, each
model's pool with its own fair queue and usage observer."""

from __future__ import annotations

import asyncio
import json

import httpx

from tandem.cluster.fake import FakeBackend
from tandem.deployment.fleet_file import parse_fleet
from tandem.deployment.tenants import hash_key, parse_tenants
from tandem.gateway.app import create_gateway_app
from tandem.gateway.ledger import Ledger
from tandem.gateway.models import build_fleet_gateway
from tandem.gateway.tenant_app import enable_tenancy
from tandem.gateway.wiring import Gateway

from .test_models import _raw

KEYS = {"alpha": "sk-alpha-0123456789", "beta": "sk-beta-0123456789"}


def _answer(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content) if request.content else {}
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    return httpx.Response(200, json={"model": body.get("model"), "choices": [{"text": "hello"}], "usage": usage})


def gateway() -> Gateway:
    raw = _raw()
    raw["models"][1]["variants"][0]["replicas"]["min"] = 1  # chat warm too: no control loop runs here
    gw = build_fleet_gateway(
        parse_fleet(raw), FakeBackend(clock=lambda: 0.0), transport=httpx.MockTransport(_answer), buffer_timeout_s=5
    )
    for _ in range(2):  # start, then ready
        for part in gw.parts():
            part.fleet.controller.tick()
    return gw


def _tenants():
    return parse_tenants(
        {
            "tenants": [
                {"name": "alpha", "keys": [hash_key(KEYS["alpha"])], "limits": {"rpm": 2}},
                {"name": "beta", "keys": [hash_key(KEYS["beta"])], "models": ["chat"]},
            ]
        }
    )


def test_every_models_requests_are_authenticated_limited_and_billed_by_tenant(tmp_path):
    gw = gateway()
    ledger = Ledger(tmp_path / "usage.db", flush_interval_s=0.05)
    tenancy = enable_tenancy(gw, _tenants(), ledger)
    code, chat = gw.models["code"], gw.models["chat"]
    assert code.tenancy is tenancy and chat.tenancy is not None and chat.tenancy.limiter is tenancy.limiter
    assert chat.tenancy.usage is not tenancy.usage  # each model's observer prices its own variants

    def post(key: str | None, model: str):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return ("POST", "/v1/completions", {"model": model, "prompt": "hi"}, headers)

    async def run() -> list[httpx.Response]:
        app = create_gateway_app(gw)
        for part in gw.parts():
            part.upstream.client = httpx.AsyncClient(transport=part.upstream.transport)
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            calls = [post(KEYS["alpha"], "code"), post(KEYS["alpha"], "chat"), post(KEYS["alpha"], "chat"),
                     post(KEYS["beta"], "code"), post(KEYS["beta"], "chat"), post("sk-nobody", "chat")]  # fmt: skip
            for method, path, body, headers in calls:
                out.append(await client.request(method, path, json=body, headers=headers))
        for part in gw.parts():
            await part.upstream.client.aclose()
        return out

    alpha_code, alpha_chat, alpha_third, beta_code, beta_chat, nobody = asyncio.run(run())
    assert alpha_code.status_code == 200 and alpha_chat.status_code == 200, (alpha_code.text, alpha_chat.text)
    # alpha's 2 requests a minute are one budget across the models
    assert alpha_third.status_code == 429 and alpha_third.json()["error"]["code"] == "rate_limit_exceeded"
    assert beta_code.status_code == 404 and beta_code.json()["error"]["code"] == "model_not_found"  # allow-list
    assert beta_chat.status_code == 200 and nobody.status_code == 401
    for t in {id(p.tenancy): p.tenancy for p in gw.parts()}.values():
        t.usage.settle()
    ledger.flush()
    served = {(r["tenant"], r["model"]): r for r in ledger.query() if r["requests_by_status"].get("200")}
    assert set(served) == {("alpha", "code"), ("alpha", "chat"), ("beta", "chat")}, ledger.query()
    assert all(r["prompt_tokens"] == 3 and r["completion_tokens"] == 5 for r in served.values())
