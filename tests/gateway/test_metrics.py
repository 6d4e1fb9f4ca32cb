"""The gateway's metric labels come from closed sets: thousands of distinct methods, paths, model
names and region headers leave the series count unchanged, and a variant that left the deployment (a
retired gate candidate) loses its gauges instead of reporting its last value for ever."""

from __future__ import annotations

import asyncio

import httpx

from tandem.cluster.fake import FakeBackend
from tandem.deployment import parse_deployment
from tandem.gateway.app import create_gateway_app
from tandem.gateway.wiring import build_gateway

from .test_shadow import BODY, Replicas, gateway, serve

OK = {"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def series(text: str) -> list[str]:
    return [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]


def test_5000_distinct_methods_and_paths_leave_the_series_count_unchanged():
    def replica(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions" and b'"model":"m"' not in request.content.replace(b" ", b""):
            return httpx.Response(404, json={"error": {"message": "no such model", "code": "model_not_found"}})
        return httpx.Response(200, json=OK)

    raw = {
        "variants": [{"name": "fast", "recipe": "baseline", "replicas": {"min": 1, "max": 2}}],
        "policy": {"name": "hpa"},
    }
    gw = build_gateway(parse_deployment(raw), FakeBackend(clock=lambda: 0.0), transport=httpx.MockTransport(replica))
    gw.controller.tick()
    gw.controller.tick()

    async def main() -> tuple[list[str], list[str], int]:
        app = create_gateway_app(gw)
        gw.client = httpx.AsyncClient(transport=gw.transport)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:

            async def others(i: int) -> None:  # an unknown method on a route, a path under one, a model, a region
                await client.request(f"M{i}", "/v1/completions")
                await client.get(f"/v1/completions/{i}")
                region = {"x-tandem-region": f"r{i}"}
                await client.post("/v1/completions", json={"model": f"m{i}", "prompt": "a"}, headers=region)
                await client.post("/v1/completions", json={"model": "m", "prompt": "a"})

            await client.request("M", "/p")
            await others(-1)  # every kind of answer once: the series they legitimately add
            before = series((await client.get("/metrics")).text)
            for i in range(5000):  # 5,000 distinct methods and paths
                await client.request(f"M{i}", f"/p{i}/q{i}")
                if i % 10 == 0:  # and 500 distinct model names and regions, unknown methods on a route
                    await others(i)
            after = series((await client.get("/metrics")).text)
        await gw.client.aclose()
        return before, after, len(gw.inflight.running)

    before, after, running = asyncio.run(main())
    assert sorted(after) == sorted(before), set(after) ^ set(before)
    assert not any("p4999" in s or "M4999" in s or "m4990" in s or "r4990" in s for s in after)
    assert running == 0
    print(f"gateway series: {len(before)} before, {len(after)} after 5,000 distinct methods and paths")


def test_a_retired_candidate_loses_its_gauges():
    replicas = Replicas(candidate_status=500)
    gw = gateway(replicas, min_samples={"errors": 2, "latency": 2, "accuracy": 1})
    asyncio.run(serve(gw, [BODY, BODY]))
    assert 'tandem:replicas{state="ready",variant="cand"} 1.0' in gw.last_metrics
    assert 'tandem:breaker_state{variant="cand"}' in gw.last_metrics
    gw.controller.retire("cand")
    for replica in gw.backend.list():
        if replica.variant == "cand":
            gw.backend.stop(replica.replica_id)
    for _ in range(3):
        gw.controller.tick()
    assert not any(r.variant == "cand" for r in gw.backend.list())
    asyncio.run(serve(gw, [BODY]))
    gauges = (
        "tandem:replicas{",
        "tandem:replicas_pending{",
        "tandem:breaker_state{",
        "tandem:gateway_buffered_requests{",
    )
    left = [s for s in series(gw.last_metrics) if s.startswith(gauges) and 'variant="cand"' in s]
    assert left == [], left
    assert 'tandem:replicas{state="ready",variant="inc"} 1.0' in gw.last_metrics
