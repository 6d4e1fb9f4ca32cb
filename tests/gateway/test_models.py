"""Many models behind one gateway, in process (a FakeBackend's replicas, an httpx MockTransport):
routing by `model`, the 404 for another, /v1/models, the admin API per model, a model scaled to zero
started by its first request, and the `model` label on the metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from tandem.cluster.fake import FakeBackend
from tandem.deployment.fleet_file import parse_fleet
from tandem.gateway.app import create_gateway_app
from tandem.gateway.models import build_fleet_gateway
from tandem.gateway.wiring import Gateway

from .harness import metric


def _raw() -> dict:
    return {
        "policy": {"name": "kpa"},
        "models": [
            {
                "name": "code",
                "variants": [
                    {"name": "fast", "recipe": "int8", "replicas": {"min": 1, "max": 2}},
                    {"name": "base", "recipe": "baseline"},
                ],
                "fallback": "base",
                "policy": {"name": "hpa"},
            },
            {"name": "chat", "variants": [{"name": "base", "recipe": "baseline", "replicas": {"min": 0, "max": 2}}]},
        ],
    }


def _answer(request: httpx.Request) -> httpx.Response:
    """A replica's answer naming itself and the model it was asked for."""
    body = json.loads(request.content) if request.content else {}
    return httpx.Response(200, json={"replica": request.url.host, "model": body.get("model"), "usage": {}})


def gateway(handler: Callable[[httpx.Request], httpx.Response] = _answer, **kw) -> Gateway:
    gw = build_fleet_gateway(
        parse_fleet(_raw()), FakeBackend(clock=lambda: 0.0), transport=httpx.MockTransport(handler), **kw
    )
    for _ in range(2):  # start, then ready
        for part in gw.parts():
            part.fleet.controller.tick()
    return gw


async def _calls(gw: Gateway, calls: list[tuple[str, str, dict | None]]) -> list[httpx.Response]:
    app = create_gateway_app(gw)
    for part in gw.parts():
        part.upstream.client = httpx.AsyncClient(transport=part.upstream.transport)
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
        for method, path, body in calls:
            out.append(await client.request(method, path, json=body))
    for part in gw.parts():
        await part.upstream.client.aclose()
    return out


def call(gw: Gateway, method: str, path: str, body: dict | None = None) -> httpx.Response:
    return asyncio.run(_calls(gw, [(method, path, body)]))[0]


def test_each_model_has_its_own_pieces_over_its_own_replicas():
    gw = gateway()
    code, chat = gw.models["code"], gw.models["chat"]
    assert gw.fleet is code.fleet and gw.registry is not code.registry  # the first model's, the gateway's registry
    assert code.dispatcher is not chat.dispatcher and code.fleet.controller is not chat.fleet.controller
    assert {r.variant for r in code.fleet.backend.list()} == {"fast", "base"}
    assert chat.fleet.backend.list() == []  # min 0: nothing until a request comes
    assert code.deployment.fallback == "base" and chat.deployment.fallback is None
    assert code.deployment.policy_name == "hpa" and chat.deployment.policy_name == "kpa"  # the file's default


def test_requests_route_by_model_and_another_model_is_a_404_naming_the_models():
    gw = gateway()
    ok, unknown, missing = asyncio.run(
        _calls(
            gw,
            [
                ("POST", "/v1/completions", {"model": "code", "prompt": "p"}),
                ("POST", "/v1/chat/completions", {"model": "nope", "messages": []}),
                ("POST", "/v1/completions", {"prompt": "p"}),
            ],
        )
    )
    assert ok.status_code == 200 and ok.json()["replica"].startswith("fast-") and ok.json()["model"] == "code"
    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "invalid_request_error")
    assert "'nope'" in error["message"] and "'code', 'chat'" in error["message"]
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"


def test_v1_models_lists_every_model_with_its_variants_cold_ones_too():
    gw = gateway()
    listing, one, unknown = asyncio.run(
        _calls(gw, [("GET", "/v1/models", None), ("GET", "/v1/models/chat", None), ("GET", "/v1/models/x", None)])
    )
    data = {m["id"]: m for m in listing.json()["data"]}
    assert list(data) == ["code", "chat"] and all(m["object"] == "model" for m in data.values())
    code = data["code"]["tandem"]
    assert code["state"] == "serving" and [v["name"] for v in code["variants"]] == ["fast", "base"]
    assert code["variants"][0]["primary"] and code["variants"][1]["fallback"]
    assert data["chat"]["tandem"]["state"] == "cold" and data["chat"]["tandem"]["variants"][0]["replicas"]["min"] == 0
    assert one.json()["id"] == "chat"
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_a_model_at_zero_is_started_by_its_first_request_which_waits_then_is_served():
    gw = gateway()
    chat = gw.models["chat"]
    clock = [100.0]
    for part in gw.parts():
        part.clock = lambda: clock[0]

    async def scenario() -> tuple[httpx.Response, dict]:
        app = create_gateway_app(gw)
        chat.upstream.client = httpx.AsyncClient(transport=chat.upstream.transport)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            task = asyncio.create_task(client.post("/v1/completions", json={"model": "chat", "prompt": "p"}))
            while not chat.fleet.inflight.buffered:  # it waits at the gateway, counted for chat's policy
                await asyncio.sleep(0.01)
            waiting = (await client.get("/admin/models")).json()
            chat.fleet.controller.tick()  # kpa sees the buffered request: one replica starts
            assert len(chat.fleet.backend.list()) == 1
            clock[0] += 2.5
            chat.fleet.controller.tick()  # it answers its probe: ready
            chat.fleet.notify()
            response = await task
        await chat.upstream.client.aclose()
        return response, waiting

    response, waiting = asyncio.run(scenario())
    assert response.status_code == 200 and response.json()["model"] == "chat"
    shown = {m["name"]: m for m in waiting["models"]}
    assert shown["chat"]["buffered"] == 1 and shown["chat"]["state"] == "cold" and shown["code"]["buffered"] == 0
    after = {m["name"]: m for m in call(gw, "GET", "/admin/models").json()["models"]}
    assert after["chat"]["last_cold_start_s"] == 2.5 and after["chat"]["cold_starts"] == 1
    assert after["chat"]["state"] == "serving" and after["chat"]["replicas"]["ready"] == 1
    assert after["code"]["last_cold_start_s"] is None and after["code"]["replicas"]["ready"] == 2


def test_admin_replicas_shows_every_models_replicas_with_their_memory():
    gw = gateway()
    view = call(gw, "GET", "/admin/replicas").json()
    assert set(view["models"]) == {"code", "chat"}
    assert {(r["model"], r["variant"]) for r in view["replicas"]} == {("code", "fast"), ("code", "base")}
    assert all(r["memory_bytes"] > 0 and r["reason"] is None for r in view["replicas"])  # the bundled model's need
    one = call(gw, "GET", "/admin/replicas?model=chat").json()
    assert one["primary"] == "base" and one["replicas"] == []


@pytest.mark.parametrize("path", ["/admin/rollout", "/admin/gate"])
def test_operator_routes_need_the_model_once_several_are_served(path):
    gw = gateway()
    missing, unknown = asyncio.run(_calls(gw, [("GET", path, None), ("GET", path + "?model=nope", None)]))
    assert missing.status_code == 400 and "'code', 'chat'" in missing.json()["error"]["message"]
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    rollout = call(gw, "GET", "/admin/rollout?model=chat").json()
    assert rollout["primary"] == "base" and rollout["rollout"] is None


def test_use_rolls_over_only_the_model_it_names():
    gw = gateway()
    missing, used = asyncio.run(
        _calls(
            gw,
            [("POST", "/admin/use", {"recipe": "int8"}), ("POST", "/admin/use", {"model": "code", "variant": "base"})],
        )
    )
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    assert used.status_code == 202 and used.json()["rollout"]["new"] == "base"
    assert gw.models["code"].fleet.controller.rollout is not None and gw.models["chat"].fleet.controller.rollout is None


def test_a_new_recipe_reserves_what_that_recipe_needs():
    gw = gateway()
    response = call(gw, "POST", "/admin/use", {"model": "chat", "recipe": "int8+kv-bf16"})
    assert response.status_code == 202
    pools = gw.models["chat"].fleet.controller.pools
    assert 0 < pools["int8-kv-bf16"].variant.replica_memory < pools["base"].variant.replica_memory


def test_metrics_carry_a_model_label_from_the_file_alone():
    gw = gateway()
    responses = asyncio.run(
        _calls(
            gw,
            [
                ("POST", "/v1/completions", {"model": "code", "prompt": "p"}),
                ("POST", "/v1/completions", {"model": 'x"}\n{evil', "prompt": "p"}),
                ("GET", "/metrics", None),
            ],
        )
    )
    text = responses[-1].text
    assert metric(text, "tandem:gateway_requests_total", variant="fast", code="200", model="code") == 1
    assert metric(text, "tandem:replicas", variant="fast", state="ready", model="code") == 1
    assert metric(text, "tandem:replicas", variant="base", state="ready", model="chat") == 0
    models = {line.split('model="')[1].split('"')[0] for line in text.splitlines() if 'model="' in line}
    assert models == {"code", "chat"}
    assert text.count("# TYPE tandem:replicas gauge") == 1  # one family, both models' series


def test_ready_waits_for_the_models_that_keep_a_replica_not_those_at_zero():
    gw = gateway()
    assert call(gw, "GET", "/ready").status_code == 200  # chat is at zero: started by its first request
    code = gw.models["code"]
    for replica in code.fleet.backend.list():
        code.fleet.backend.crash(replica.replica_id)
    assert call(gw, "GET", "/ready").status_code == 503


def test_a_single_model_gateway_is_what_it_was():
    from tandem.deployment import parse_deployment
    from tandem.gateway.wiring import build_gateway

    raw = {"variants": [{"name": "fast", "recipe": "int8"}], "policy": {"name": "hpa"}}
    gw = build_fleet_gateway(parse_fleet(raw), FakeBackend(clock=lambda: 0.0))
    assert gw.models == {} and gw.parts() == [gw]
    plain = build_gateway(parse_deployment(raw), FakeBackend(clock=lambda: 0.0))
    assert gw.deployment == plain.deployment
    assert call(gw, "GET", "/admin/models").json()["models"][0]["name"] is None
