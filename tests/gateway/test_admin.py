"""The operator API in process (a FakeBackend's replicas, an httpx MockTransport): what runs and why,
switching the primary traffic by variant or recipe, following the rollout, and the API key."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tandem.cluster.fake import FakeBackend
from tandem.contracts import Profile, ReplicaLoad
from tandem.deployment import parse_deployment
from tandem.gateway.app import create_gateway_app
from tandem.gateway.wiring import Gateway, build_gateway
from tandem.schedule.rollout import Phase


def _profile(model, recipe, threads) -> Profile:
    return Profile(
        recipe or "int8+kv-bf16+ngram", "cpu", str(model), 1000, 64, 8, {1: 50.0, 8: 200.0}, 1000.0, 0.05, 3.0
    )


HPA = {"name": "hpa"}
CAPACITY_PROFILE = {"recipe": "int8", "hardware": "cpu", "model": "m", "weight_bytes": 1, "kv_bytes_per_token": 1,
                    "max_slots": 8, "decode_tokens_per_s": {"1": 50.0}, "prefill_tokens_per_s": 1000.0,
                    "ttft_s_p50": 0.05, "cold_start_s": 3.0}  # fmt: skip


def gateway(policy=HPA, **kwargs) -> Gateway:
    raw = {
        "variants": [
            {"name": "fast", "recipe": "int8", "replicas": {"min": 2, "max": 4}},
            {"name": "base", "recipe": "baseline"},
        ],
        "fallback": "base",
        "policy": policy,
    }
    if policy["name"] == "capacity":
        for v in raw["variants"]:
            v["profile"] = CAPACITY_PROFILE
    backend = FakeBackend(clock=lambda: 0.0)
    gw = build_gateway(parse_deployment(raw), backend, transport=httpx.MockTransport(lambda r: httpx.Response(200)),
                       **kwargs)  # fmt: skip
    gw.fleet.controller.tick()
    gw.fleet.controller.tick()
    return gw


async def _requests(gw: Gateway, calls: list[tuple[str, str, dict | None]], api_key: str | None = None):
    app = create_gateway_app(gw, api_key=api_key)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
        out = []
        for method, path, body in calls:
            out.append(await client.request(method, path, json=body))
        return out


def call(gw: Gateway, method: str, path: str, body: dict | None = None, api_key: str | None = None) -> httpx.Response:
    return asyncio.run(_requests(gw, [(method, path, body)], api_key))[0]


def test_replicas_shows_each_replica_its_load_and_its_variants_failures():
    gw = gateway()
    gw.fleet.inflight.report(ReplicaLoad("fast-1", "local", "fast", running=3, waiting=1, kv_used=0.5, healthy=True))
    gw.fleet.backend.crash(
        "fast-2", exit_code=1, output="INFO x\nERROR tandem.serve: cannot serve the model: out of memory\n"
    )
    gw.fleet.controller.tick()
    view = call(gw, "GET", "/admin/replicas").json()
    assert view["primary"] == "fast" and view["fallback"] == "base"
    by_id = {r["id"]: r for r in view["replicas"]}
    fast1 = by_id["fast-1"]
    assert (fast1["variant"], fast1["recipe"], fast1["region"], fast1["state"]) == ("fast", "int8", "local", "ready")
    assert fast1["address"] == "fake://fast-1" and fast1["load"]["running"] == 3 and fast1["load"]["kv_used"] == 0.5
    assert fast1["routing"] == {"outstanding": 4, "healthy": True, "source": "tandem"}
    assert fast1["engine"] == "tandem" and fast1["load"]["source"] == "tandem"
    assert fast1["restarts"] == 1 and "out of memory" in fast1["last_error"]
    assert view["variants"]["fast"]["restarts"] == 1 and view["variants"]["base"]["restarts"] == 0
    (exited,) = view["recent_exits"]
    assert exited["id"] == "fast-2" and exited["code"] == 1 and "out of memory" in exited["error"]
    assert exited["streams_resumed"] == 0  # streams cut by its exit and resumed elsewhere (none here)
    # Why it scales or not: the policy's last decision and what it was made on.
    scaling = view["variants"]["fast"]["scaling"]
    assert scaling["policy"] and scaling["outcome"] in ("up", "down", "hold", "backing off")
    assert scaling["in_flight"] >= 4 and scaling["kv_used"] == 0.5 and scaling["limits"]["max"] >= 1
    assert {"current", "ready", "desired", "demand", "notes", "age_s"} <= scaling.keys()


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({}, 400, "exactly one of 'variant' and 'recipe'"),
        ({"variant": "base", "recipe": "bf16"}, 400, "exactly one of"),
        ({"recipe": "bf16", "colour": 1}, 400, "colour: unknown field"),
        ({"variant": "nope"}, 404, "no variant is called 'nope' (known: base, fast)"),
        ({"variant": "fast"}, 409, "already serves the primary traffic"),
    ],
)
def test_use_refuses_bad_requests_with_an_openai_style_error(body, status, needle):
    response = call(gateway(), "POST", "/admin/use", body)
    assert response.status_code == status and needle in response.json()["error"]["message"]


def test_use_a_recipe_starts_a_rollout_and_a_second_one_waits():
    gw = gateway()
    accepted, busy, progress = asyncio.run(
        _requests(gw, [("POST", "/admin/use", {"recipe": "bf16"}), ("POST", "/admin/use", {"recipe": "int8+ngram"}),
                       ("GET", "/admin/rollout", None)])
    )  # fmt: skip
    assert accepted.status_code == 202 and accepted.json()["rollout"]["new"] == "bf16"
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "rollout_in_progress"
    rollout = progress.json()["rollout"]
    assert (rollout["old"], rollout["new"], rollout["phase"], rollout["target"]) == ("fast", "bf16", "starting", 2)
    new = gw.fleet.controller.pools["bf16"].variant
    assert new.recipe == "bf16" and new.extra_args == gw.fleet.controller.pools["fast"].variant.extra_args
    for _ in range(6):
        gw.fleet.controller.tick()
    assert gw.fleet.controller.rollout.phase is Phase.DONE and gw.fleet.controller.primary == "bf16"
    assert call(gw, "GET", "/admin/rollout").json()["rollout"]["phase"] == "done"
    back = call(gw, "POST", "/admin/use", {"variant": "fast"})  # roll back by name
    assert back.status_code == 202 and back.json()["rollout"]["new"] == "fast"


def test_under_the_capacity_policy_a_new_recipes_profile_is_measured_first():
    measured = []

    def profile(model, recipe, threads):
        measured.append(recipe)
        return _profile(model, recipe, threads)

    gw = gateway({"name": "capacity"}, profile=profile)

    async def scenario() -> dict:
        app = create_gateway_app(gw)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            accepted = await client.post("/admin/use", json={"recipe": "bf16"})
            assert accepted.status_code == 202
            for _ in range(100):
                if gw.fleet.controller.rollout is not None:
                    break
                await asyncio.sleep(0.01)
            return (await client.get("/admin/rollout")).json()

    view = asyncio.run(scenario())
    assert measured == ["bf16"] and view["preparing"] is None and view["rollout"]["new"] == "bf16"
    assert gw.fleet.controller.pools["bf16"].variant.profile.recipe == "bf16"


def test_a_second_use_while_the_first_ones_profile_is_measured_is_409_and_a_failed_one_frees_the_way():
    import threading

    release = threading.Event()

    def profile(model, recipe, threads):
        if recipe == "bf16":  # the first rollout's measurement takes a while
            assert release.wait(60), "the test never released the measurement"
            raise RuntimeError("the profile run ran out of memory")
        return _profile(model, recipe, threads)

    gw = gateway({"name": "capacity"}, profile=profile)

    async def scenario() -> tuple[httpx.Response, httpx.Response, dict, httpx.Response]:
        app = create_gateway_app(gw)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            try:
                first = await client.post("/admin/use", json={"recipe": "bf16"})
                busy = await client.post("/admin/use", json={"recipe": "int8+ngram"})
            finally:
                release.set()
            for _ in range(500):
                view = (await client.get("/admin/rollout")).json()
                if view["preparing"] is not None and view["preparing"].get("error"):
                    break
                await asyncio.sleep(0.01)
            again = await client.post("/admin/use", json={"recipe": "int8+ngram"})
            return first, busy, view, again

    first, busy, view, again = asyncio.run(scenario())
    assert first.status_code == 202 and first.json()["preparing"]["variant"] == "bf16"
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "rollout_in_progress"
    assert "a rollout to 'bf16' is under way" in busy.json()["error"]["message"]
    assert "out of memory" in view["preparing"]["error"] and view["rollout"] is None
    assert gw.fleet.controller.primary == "fast"  # the incumbent kept the traffic
    assert again.status_code == 202, again.text  # a failed preparation does not block the next one


def test_the_admin_api_needs_the_api_key_when_one_is_set():
    gw = gateway()
    refused = call(gw, "GET", "/admin/replicas", api_key="s3cret")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert call(gw, "POST", "/admin/use", {"recipe": "bf16"}, api_key="s3cret").status_code == 401

    async def with_key() -> httpx.Response:
        app = create_gateway_app(gw, api_key="s3cret")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            return await client.get("/admin/replicas", headers={"Authorization": "Bearer s3cret"})

    assert asyncio.run(with_key()).status_code == 200
    assert call(gw, "GET", "/health", api_key="s3cret").status_code == 200


def test_a_new_recipe_keeps_the_primarys_model_settings_and_what_its_replicas_reserve():
    from dataclasses import replace

    from tandem.gateway.admin import UseRequest, variant_to_use

    gw = gateway()
    snap = gw.fleet.controller.snapshot()
    primary = replace(snap.pools["fast"].variant, accelerators=1.0, memory_bytes=3 << 30)
    snap = replace(snap, pools={**snap.pools, "fast": replace(snap.pools["fast"], variant=primary)})
    chosen = variant_to_use(gw.fleet.variants, snap, UseRequest(recipe="bf16"))
    assert (chosen.name, chosen.recipe, chosen.profile) == ("bf16", "bf16", None)
    assert (chosen.memory_bytes, chosen.accelerators, chosen.threads) == (3 << 30, 1.0, primary.threads)


def test_replicas_show_their_node_and_why_one_is_not_placed():
    from dataclasses import replace

    from tandem.cluster.backend import PendingPlacement
    from tandem.gateway.admin import replicas_view

    gw = gateway()
    snap = gw.fleet.controller.snapshot()
    waiting = PendingPlacement("too-large", "no node is large enough: it needs memory 5.00 GiB")
    first, second, *rest = snap.replicas
    snap = replace(snap, replicas=(replace(first, node="abc"), replace(second, pending=waiting), *rest))
    shown = {r["id"]: r for r in replicas_view(gw, snap)["replicas"]}
    assert (shown[first.replica_id]["node"], shown[first.replica_id]["pending"]) == ("abc", None)
    assert shown[second.replica_id]["pending"] == {"cause": "too-large", "detail": waiting.detail}
