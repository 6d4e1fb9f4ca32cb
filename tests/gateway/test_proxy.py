"""The gateway's proxy in process: a FakeBackend's replicas answered by an httpx MockTransport.

Fast checks of each path through `proxy`: region routing, retries on another replica and on the
fallback, client errors passed through, buffering while nothing is ready (and a drain answering
it at once), stream failures before and after the first byte, replicas' own loads steering the
router away from a saturated replica, and the request metrics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx

from tandem.cluster.fake import FakeBackend
from tandem.deployment import parse_deployment
from tandem.gateway.app import create_gateway_app
from tandem.gateway.loads import poll_loads
from tandem.gateway.proxy import REGION_HEADER
from tandem.gateway.wiring import Gateway, build_gateway

from .harness import metric

OK = {"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
SSE = b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [{"text": "b"}]}\n\ndata: [DONE]\n\n'


def _gateway(raw: dict, handler: Callable[[httpx.Request], httpx.Response], **kw) -> tuple[Gateway, list[str]]:
    seen: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        return handler(request)

    backend = FakeBackend(clock=lambda: 0.0)
    gw = build_gateway(parse_deployment(raw), backend, transport=httpx.MockTransport(record), **kw)
    gw.fleet.controller.tick()  # start the replicas
    gw.fleet.controller.tick()  # they answer their probes: ready
    return gw, seen


async def _call(gw: Gateway, body: dict, headers: dict | None = None) -> httpx.Response:
    app = create_gateway_app(gw)
    gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
        response = await client.post("/v1/completions", json=body, headers=headers or {})
        await response.aread()
    await gw.upstream.client.aclose()
    return response


def call(gw: Gateway, body: dict | None = None, headers: dict | None = None) -> httpx.Response:
    return asyncio.run(_call(gw, body or {"model": "m", "prompt": "p"}, headers))


def one(name: str = "fast", lo: int = 1) -> dict:
    return {"name": name, "recipe": "baseline", "replicas": {"min": lo, "max": 4}}


HPA = {"name": "hpa"}


def test_the_region_header_picks_the_replica_in_that_region():
    raw = {"variants": [one(lo=2)], "regions": ["eu", "us"], "policy": HPA, "router": {"name": "region-aware"}}
    gw, seen = _gateway(raw, lambda r: httpx.Response(200, json=OK))
    where = {r.replica_id: r.region for r in gw.fleet.backend.list()}
    assert sorted(where.values()) == ["eu", "us"]
    for region in ("us", "eu", "us"):
        assert call(gw, headers={REGION_HEADER: region}).status_code == 200
        assert where[seen[-1]] == region
    assert not gw.fleet.inflight.running


def test_a_server_error_is_rerun_on_the_fallback_and_counted():
    raw = {"variants": [one(), one("base")], "fallback": "base", "policy": HPA}
    gw, seen = _gateway(raw, lambda r: httpx.Response(500 if r.url.host.startswith("fast") else 200, json=OK))
    response = call(gw)
    assert response.status_code == 200 and response.json() == OK
    assert seen == ["fast-1", "base-2"]
    assert metric(asyncio.run(_metrics(gw)), "tandem:fallback_total", variant="fast") == 1


async def _metrics(gw: Gateway) -> str:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(create_gateway_app(gw)), base_url="http://gw") as c:
        return (await c.get("/metrics")).text


def test_an_unreachable_replica_is_skipped_for_another_of_the_same_variant():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "fast-1":
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=OK)

    gw, seen = _gateway({"variants": [one(lo=2)], "policy": HPA}, handler)
    assert call(gw).status_code == 200 and seen == ["fast-1", "fast-2"]
    assert not gw.fleet.inflight.reachable("fast-1")
    assert call(gw).status_code == 200 and seen[-1] == "fast-2"  # skipped for a while


def test_client_errors_pass_through_and_exhausted_retries_are_a_503():
    error = {"error": {"message": "prompt must be a string", "code": "bad"}}
    gw, seen = _gateway({"variants": [one(lo=2)], "policy": HPA}, lambda r: httpx.Response(400, json=error))
    response = call(gw)
    assert response.status_code == 400 and response.json() == error and len(seen) == 1

    raw = {"variants": [one(lo=2), one("base")], "fallback": "base", "policy": HPA}
    gw, seen = _gateway(raw, lambda r: httpx.Response(500, json=error))
    response = call(gw)
    assert response.status_code == 503 and response.json()["error"]["code"] == "upstream_failed"
    assert response.json()["error"]["type"] == "server_error"
    assert seen == ["fast-1", "base-3"]  # the fallback failed too, with no other replica of its own: a 503
    assert not gw.fleet.inflight.running
    text = asyncio.run(_metrics(gw))
    assert metric(text, "tandem:gateway_requests_total", variant="base", code="503") == 1
    assert metric(text, "tandem:gateway_retries_total", variant="fast") == 1


def test_a_request_waits_for_a_replica_then_gets_a_503():
    backend = FakeBackend(clock=lambda: 0.0)
    gw = build_gateway(
        parse_deployment({"variants": [one()], "policy": HPA}), backend, buffer_timeout_s=0.3,
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json=OK)),
    )  # fmt: skip
    buffered: list[int] = []

    async def scenario() -> httpx.Response:
        task = asyncio.create_task(_call(gw, {"prompt": "p"}))
        await asyncio.sleep(0.1)
        buffered.append(gw.fleet.controller.buffered("fast"))  # what the policy sees
        return await task

    response = asyncio.run(scenario())
    assert response.status_code == 503 and response.json()["error"]["code"] == "no_replica"
    assert buffered == [1] and gw.fleet.controller.buffered("fast") == 0


def test_a_drain_answers_waiting_requests_at_once():
    backend = FakeBackend(clock=lambda: 0.0)
    gw = build_gateway(
        parse_deployment({"variants": [one()], "policy": HPA}), backend, buffer_timeout_s=60.0,
        transport=httpx.MockTransport(lambda r: httpx.Response(200, json=OK)),
    )  # fmt: skip

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        task = asyncio.create_task(_call(gw, {"prompt": "p"}))
        while not gw.fleet.inflight.buffered:
            await asyncio.sleep(0.01)
        gw.begin_drain()  # SIGTERM
        waiting = await asyncio.wait_for(task, 5.0)
        return waiting, await _call(gw, {"prompt": "p"})

    waiting, late = asyncio.run(scenario())
    for response in (waiting, late):
        assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
    assert not gw.fleet.inflight.buffered


def test_reported_loads_steer_requests_away_from_a_saturated_replica():
    """fast-1 is full of requests from elsewhere (its own GET /load says so); the gateway sends to fast-2."""
    reports = {
        "fast-1": {"running": 8, "waiting": 5, "kv_used": 1.0, "healthy": True},
        "fast-2": {"running": 1, "waiting": 0, "kv_used": 0.125, "healthy": True},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/load":
            return httpx.Response(200, json={"replica_id": request.url.host, **reports[request.url.host]})
        return httpx.Response(200, json=OK)

    gw, seen = _gateway({"variants": [one(lo=2)], "policy": HPA}, handler)

    async def poll_then_call() -> list[int]:
        gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport)
        assert await poll_loads(gw.fleet, gw.upstream) == 2
        await gw.upstream.client.aclose()
        return [(await _call(gw, {"model": "m", "prompt": "p"})).status_code for _ in range(4)]

    assert asyncio.run(poll_then_call()) == [200] * 4
    polls, proxied = seen[:2], seen[2:]
    assert sorted(polls) == ["fast-1", "fast-2"]
    assert proxied == ["fast-2"] * 4  # with no reports the tie (0 in flight each) would go to fast-1
    loads = {load.replica_id: load for load in gw.dispatcher.loads()}
    assert (loads["fast-1"].running, loads["fast-1"].waiting, loads["fast-1"].kv_used) == (8, 5, 1.0)


def test_a_load_report_naming_another_replica_is_ignored():
    def handler(request: httpx.Request) -> httpx.Response:  # a port reused by some other replica
        return httpx.Response(200, json={"replica_id": "stranger", "running": 0, "waiting": 0, "kv_used": 0.0,
                                         "healthy": True})  # fmt: skip

    gw, _ = _gateway({"variants": [one()], "policy": HPA}, handler)

    async def poll() -> int:
        gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport)
        try:
            return await poll_loads(gw.fleet, gw.upstream)
        finally:
            await gw.upstream.client.aclose()

    assert asyncio.run(poll()) == 0 and gw.fleet.inflight.reports == {}


class _BrokenStream(httpx.AsyncByteStream):
    def __init__(self, good: bytes) -> None:
        self.good = good

    async def __aiter__(self):
        if self.good:
            yield self.good
        raise httpx.ReadError("connection reset")


def test_a_stream_that_breaks_before_its_first_byte_is_rerun_after_it_ends_with_an_error_event():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "fast-1":
            return httpx.Response(200, stream=_BrokenStream(b""))
        return httpx.Response(200, content=SSE, headers={"content-type": "text/event-stream"})

    body = {"prompt": "p", "stream": True}
    gw, seen = _gateway({"variants": [one(lo=2)], "policy": HPA}, handler)
    response = call(gw, body)
    assert response.status_code == 200 and response.content == SSE and seen == ["fast-1", "fast-2"]
    assert not gw.fleet.inflight.running

    gw, seen = _gateway(
        {"variants": [one()], "policy": HPA}, lambda r: httpx.Response(200, stream=_BrokenStream(SSE[:40]))
    )
    response = call(gw, body)
    # The whole events it sent (a partial event is never relayed), then the error event: nowhere to resume it.
    assert response.status_code == 200 and response.content.startswith(SSE[:40].rsplit(b"\n\n", 1)[0] + b"\n\n")
    assert response.content.count(b'"choices"') == 1
    assert response.text.endswith("data: [DONE]\n\n")
    event = json.loads(response.text.rsplit("data: ", 2)[1])
    assert event["error"]["code"] == "replica_unreachable" and event["error"]["type"] == "server_error"
    assert len(seen) == 1 and not gw.fleet.inflight.running
    assert metric(asyncio.run(_metrics(gw)), "tandem:gateway_stream_errors_total", variant="fast") == 1


def test_vllm_utility_routes_are_answered_by_a_primary_replica_behind_the_key():
    """POST /tokenize and /detokenize, GET /version: passed to a ready replica (the primary's first),
    body and all; the user's API key guards the token routes as on a replica."""
    raw = {"variants": [one(), one("base")], "primary": "fast", "fallback": "base", "policy": HPA}
    asked: list[tuple[str, str, bytes]] = []

    def replica(request: httpx.Request) -> httpx.Response:
        asked.append((request.url.host, request.url.path, request.content))
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"count": 2, "max_model_len": 64, "tokens": [5, 6]})
        return httpx.Response(200, json={"version": "1.2.3"} if request.url.path == "/version" else {"prompt": "hi"})

    gw, _ = _gateway(raw, replica)

    async def main() -> list[httpx.Response]:
        app = create_gateway_app(gw, api_key="k")
        gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            key = {"Authorization": "Bearer k"}
            out = [
                await client.post("/tokenize", json={"prompt": "hi"}, headers=key),
                await client.post("/detokenize", json={"tokens": [5, 6]}, headers=key),
                await client.get("/version"),
                await client.post("/tokenize", json={"prompt": "hi"}),
            ]
        await gw.upstream.client.aclose()
        return out

    tokenized, detokenized, version, unauthorized = asyncio.run(main())
    assert tokenized.json()["tokens"] == [5, 6] and detokenized.json() == {"prompt": "hi"}
    assert version.json() == {"version": "1.2.3"} and unauthorized.status_code == 401
    assert [path for _, path, _ in asked] == ["/tokenize", "/detokenize", "/version"]
    assert all(host.startswith("fast") for host, _, _ in asked)  # the primary's replica
    assert json.loads(asked[0][2]) == {"prompt": "hi"}  # the body reached it


def test_5000_client_404s_write_no_line_each(caplog):
    """A replica's 404 to a client (an unknown model) is the client's business: logged at debug, not info."""
    import logging

    raw = {"variants": [one()], "policy": HPA}
    gw, _ = _gateway(raw, lambda r: httpx.Response(404, json={"error": {"message": "no such model"}}))

    async def main() -> list[int]:
        app = create_gateway_app(gw)
        gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            statuses = [
                (await client.post("/v1/completions", json={"model": f"m{i}", "prompt": "p"})).status_code
                for i in range(5000)
            ]
        await gw.upstream.client.aclose()
        return statuses

    with caplog.at_level(logging.INFO, logger="tandem"):
        statuses = asyncio.run(main())
    assert statuses == [404] * 5000
    lines = [r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith("tandem")]
    assert len(lines) < 10, [r.getMessage() for r in lines[:10]]
    print(f"5,000 client 404s through the gateway: {len(lines)} log lines at info or above")
    assert not gw.fleet.inflight.running


class _LateStream(httpx.AsyncByteStream):
    """A stream whose first chunk comes after `delay_s` (a long stop string holding text back)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def __aiter__(self):
        await asyncio.sleep(self.delay_s)
        yield SSE


def test_a_late_first_byte_on_healthy_replicas_is_retried_once_then_answered_504_and_counts_against_no_one():
    seen_paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_paths.append(request.url.path)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(200, stream=_LateStream(30.0), headers={"content-type": "text/event-stream"})

    body = {"prompt": "p", "stream": True}
    gw, seen = _gateway({"variants": [one(lo=3)], "policy": HPA}, handler, first_byte_timeout_s=0.2)
    response = call(gw, body)
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "first_byte_timeout" and "any of 2 replicas" in error["message"]
    assert seen_paths.count("/v1/completions") == 2 and seen_paths.count("/health") == 2  # one retry, not two
    assert gw.upstream.liveness.unresponsive == {} and not gw.fleet.inflight.running
    text = asyncio.run(_metrics(gw))
    assert metric(text, "tandem:breaker_state", variant="fast") == 0
    assert metric(text, "tandem:gateway_retries_total", variant="fast") == 1

    # Mid-stream: a pause of this stream alone ends it with its own error event; the replica stays routed.
    def pausing(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})

        class Pause(httpx.AsyncByteStream):
            async def __aiter__(self):
                yield SSE[:40]
                await asyncio.sleep(30)

        return httpx.Response(200, stream=Pause(), headers={"content-type": "text/event-stream"})

    gw, _ = _gateway({"variants": [one()], "policy": HPA}, pausing, stream_idle_timeout_s=0.2)
    response = call(gw, body)
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    event = json.loads(response.text.rsplit("data: ", 2)[1])
    assert event["error"]["code"] == "stream_idle_timeout"
    assert gw.upstream.liveness.unresponsive == {} and not gw.fleet.inflight.running
    assert metric(asyncio.run(_metrics(gw)), "tandem:breaker_state", variant="fast") == 0


def test_a_model_id_is_passed_on_encoded_as_it_came():
    """GET /v1/models/{id} with characters a URL cannot hold raw (a control character, "?", "#", "%"):
    the replica is asked for that very id (and answers 404), never a 500 or another model."""
    asked: list[str] = []

    def replica(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.raw_path.decode())
        return httpx.Response(404, json={"error": {"message": "no such model", "type": "invalid_request_error",
                                                   "param": "model", "code": "model_not_found"}})  # fmt: skip

    gw, _ = _gateway({"variants": [one()], "policy": HPA}, replica)

    async def main() -> list[httpx.Response]:
        app = create_gateway_app(gw)
        gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            out = [await client.get(f"/v1/models/{path}") for path in ("%10%06", "a%3Fb%23c", "org/name%25")]
        await gw.upstream.client.aclose()
        return out

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [404] * 3, [r.text for r in responses]
    assert all(r.json()["error"]["code"] in ("model_not_found", "not_found") for r in responses)
    # A control character or an encoded "%" is refused at the gateway's door (not a canonical path:
    # tandem.edge.paths); "?" and "#" reach the replica as that very id, never as another one.
    assert asked == ["/v1/models/a%3Fb%23c"]
