"""Shadow traffic through the gateway's proxy, in process: a FakeBackend's replicas answered by an
httpx MockTransport (the incumbent `inc`, the gate's candidate `cand`).

The client only ever gets the incumbent's answer, at once even while the candidate hangs; copies keep
the client's sampling parameters and carry the fleet's secret, not the client's key; a full queue
drops and counts; a candidate's failure reaches no client, no breaker and no client-facing metric;
the gate's tick retires a failed candidate and promotes a passing one through Controller.use.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest
from completion_events import completion_chunk, sse, usage_chunk
from gate.helpers import agreeing, profile

from tandem.cluster.fake import FakeBackend
from tandem.deployment import DeploymentError, parse_deployment
from tandem.edge.keep_track import KEEP_TRACK_HEADER, KEPT_TRACK_HEADER, KEPT_TRACK_PATH
from tandem.gate.state import GateState
from tandem.gateway.app import create_gateway_app
from tandem.gateway.wiring import Gateway, build_gateway
from tandem.schedule.breaker import BreakerMode

from .harness import metric

STREAM = sse(completion_chunk("a", tokens=["a"]), completion_chunk("b", tokens=["b"]), usage_chunk(2), "[DONE]")
WHOLE = {"choices": [{"index": 0, "text": "ab", "finish_reason": "length"}], "usage": {"completion_tokens": 2}}
BODY = {"model": "m", "prompt": "def f():", "max_tokens": 2, "temperature": 0.7, "top_p": 0.9, "seed": 7}


def deployment(**gate) -> dict:
    return {
        "variants": [
            {"name": "inc", "recipe": "baseline", "replicas": {"min": 1, "max": 2}},
            {"name": "cand", "recipe": "int8", "replicas": {"min": 1, "max": 1}},
        ],
        "policy": {"name": "hpa"},
        "gate": {"candidate": "cand", "fraction": 1.0, "accuracy": {"score_fraction": 1.0}, **gate},
    }


class Replicas:
    """The MockTransport's replicas: `inc-*` answer at once; `cand-*` answer, fail or hold every request."""

    def __init__(self, candidate_status: int = 200, hold: bool = False) -> None:
        self.candidate_status, self.hold = candidate_status, hold
        self.release = asyncio.Event()
        self.seen: list[tuple[str, dict, httpx.Headers]] = []
        self.cancelled = 0
        self.fetched: list[tuple[str, str]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the gate fetching a kept track: this mock lost it (evicted, say)
            self.fetched.append((request.url.host, request.url.path))
            return httpx.Response(404, json={"error": {"message": "no kept track"}})
        body = json.loads(request.content) if request.content else {}
        self.seen.append((request.url.host, body, request.headers))
        stream = body.get("stream") is True
        if request.url.host.startswith("cand"):
            if self.hold:
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    self.cancelled += 1
                    raise
            if self.candidate_status != 200:
                return httpx.Response(self.candidate_status, json={"error": {"message": "candidate broke"}})
        # A tandem replica asked to keep a track says it keeps one (tandem.edge.keep_track).
        said = {KEPT_TRACK_HEADER: "1"} if KEEP_TRACK_HEADER in request.headers else {}
        if stream:
            return httpx.Response(200, content=STREAM, headers=said)
        return httpx.Response(200, json=WHOLE, headers=said)

    def to(self, prefix: str) -> list[dict]:
        return [body for host, body, _ in self.seen if host.startswith(prefix) and not body.get("echo")]


def gateway(replicas: Replicas, gate_log_dir=None, **gate) -> Gateway:
    backend = FakeBackend(clock=lambda: 0.0)
    gw = build_gateway(
        parse_deployment(deployment(**gate)), backend, transport=httpx.MockTransport(replicas),
        rng=random.Random(0), fleet_secret="fleet", gate_log_dir=gate_log_dir,
    )  # fmt: skip
    gw.fleet.controller.tick()  # start the replicas
    gw.fleet.controller.tick()  # ready
    return gw


async def serve(gw: Gateway, requests: list[dict], settle=None) -> list[httpx.Response]:
    """Send `requests` through the app; `settle` (async) runs before the mirror is closed."""
    app = create_gateway_app(gw)
    gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport, headers={"Authorization": "Bearer fleet"})
    assert gw.shadow is not None
    gw.shadow.start(gw.upstream.client)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
        headers = {"Authorization": "Bearer client-key", "x-request-id": "req"}
        responses = [await client.post("/v1/completions", json=body, headers=headers) for body in requests]
        if settle is not None:
            await settle(gw)
        metrics = await client.get("/metrics")
        view = await client.get("/admin/gate")
    await gw.shadow.aclose()
    await gw.upstream.client.aclose()
    gw.last_metrics, gw.last_view = metrics.text, view.json()  # type: ignore[attr-defined]
    return responses


async def drained(gw: Gateway) -> None:
    assert gw.shadow is not None and gw.shadow.mirror is not None
    await gw.shadow.mirror.drain()


def test_a_mirrored_stream_keeps_the_clients_parameters_and_becomes_a_pair():
    replicas = Replicas()
    gw = gateway(replicas)
    (response,) = asyncio.run(serve(gw, [{**BODY, "stream": True}], drained))
    assert response.status_code == 200 and response.text == STREAM.decode()
    (copy,) = replicas.to("cand")
    assert copy == {**BODY, "stream": True, "stream_options": {"include_usage": True}}  # the client's parameters
    candidate_headers = next(h for host, _, h in replicas.seen if host.startswith("cand"))
    assert candidate_headers["authorization"] == "Bearer fleet"  # never the client's key
    (pair,) = gw.shadow.pairs.snapshot()
    assert pair.incumbent.ok and pair.incumbent.text == "ab" and pair.incumbent.ttft_s is not None
    assert pair.candidate.ok and pair.candidate.completion_tokens == 2
    assert pair.sampling.temperature == 0.7 and pair.sampling.seed == 7
    text = gw.last_metrics
    assert metric(text, "tandem:shadow_requests_total", candidate="cand", outcome="paired") == 1
    assert metric(text, "tandem:gate_state", candidate="cand") == 0  # shadowing
    # Only the client's request counts in the client-facing metrics, and it was served by the incumbent.
    assert metric(text, "tandem:gateway_requests_total", variant="inc", code="200") == 1
    assert metric(text, "tandem:gateway_requests_total", variant="cand", code="200") == 0
    view = gw.last_view
    assert view["state"] == "shadowing" and view["incumbent"] == "inc" and view["candidate"] == "cand"
    assert view["samples"] == 1 and view["mirror"]["paired"] == 1 and view["fraction"] == 1.0


def test_the_pairs_file_holding_clients_completions_is_owner_only(tmp_path):
    replicas = Replicas()
    gw = gateway(replicas, gate_log_dir=tmp_path)
    asyncio.run(serve(gw, [{**BODY, "stream": True}], drained))
    pairs = tmp_path / "gate-pairs.jsonl"
    assert pairs.stat().st_mode & 0o777 == 0o600
    assert '"ab"' in pairs.read_text()  # the incumbent's completion text


def test_the_incumbent_is_asked_to_keep_its_track_for_mirrored_text_completions_only():
    replicas = Replicas()
    gw = gateway(replicas)
    bodies = [
        BODY,
        {**BODY, "stream": True},
        {**BODY, "logprobs": 1},
        {**BODY, "prompt": [1, 2, 3]},
        {**BODY, "echo": True},
    ]
    responses = asyncio.run(serve(gw, bodies, drained))
    assert [r.status_code for r in responses] == [200] * 5
    clients = [h for host, b, h in replicas.seen if host.startswith("inc") and b.get("max_tokens") != 0]
    asked = [h.get(KEEP_TRACK_HEADER) for h in clients]  # on the clients' requests (not the gate's echoes)
    assert len(asked) == 5 and all(asked[:2]) and asked[0] != asked[1] and asked[2:] == [None, None, None]
    assert all(KEEP_TRACK_HEADER not in h for host, _, h in replicas.seen if host.startswith("cand"))
    # The gate asks the replica that served it for its track (this mock keeps none and ignores echo,
    # which turns teacher forcing off after the first pair: tests/gate/test_scoring.py has the rest).
    assert replicas.fetched and {path for _, path in replicas.fetched} <= {f"{KEPT_TRACK_PATH}/{k}" for k in asked[:2]}
    assert all(host.startswith("inc") for host, _ in replicas.fetched)
    assert gw.last_view["scoring"]["incumbent_kept_track"] == 0


def test_only_the_scored_share_of_pairs_costs_the_replicas_a_scoring_request():
    replicas = Replicas()
    gw = gateway(replicas, accuracy={"score_fraction": 0.5})
    responses = asyncio.run(serve(gw, [BODY] * 40, drained))
    assert [r.status_code for r in responses] == [200] * 40
    view = gw.last_view
    scored, unscored = view["mirror"]["mirrored"] - view["mirror"]["unscored"], view["mirror"]["unscored"]
    assert view["mirror"]["paired"] == 40 and 10 <= unscored <= 30  # a random half
    asked = [h.get(KEEP_TRACK_HEADER) for host, b, h in replicas.seen if host.startswith("inc") and not b.get("echo")]
    assert sum(key is not None for key in asked) == scored  # only scored pairs ask the incumbent to keep a track
    pairs = gw.shadow.pairs.snapshot()
    notes = [p.note for p in pairs if p.note and "share of pairs scored" in p.note]
    assert len(notes) == unscored and all(p.agreement is None for p in pairs if p.note in notes)
    assert metric(gw.last_metrics, "tandem:shadow_requests_total", candidate="cand", outcome="unscored") == unscored


def test_the_client_is_answered_while_the_candidate_hangs():
    replicas = Replicas(hold=True)
    gw = gateway(replicas)

    async def main():
        async def check(_gw):
            assert len(replicas.to("cand")) == 2 and replicas.cancelled == 0  # both copies still held

        return await serve(gw, [{**BODY, "stream": True}, BODY], check)

    streamed, whole = asyncio.run(main())
    assert streamed.status_code == 200 and streamed.text == STREAM.decode()
    assert whole.status_code == 200 and whole.json() == WHOLE
    assert replicas.cancelled == 2  # closing the gateway abandons the copies; the clients had their answers


def test_a_full_shadow_queue_drops_the_copy_and_counts_it():
    replicas = Replicas(hold=True)
    gw = gateway(replicas, shadow={"queue": 1, "concurrency": 1})
    responses = asyncio.run(serve(gw, [BODY] * 4))
    assert [r.status_code for r in responses] == [200] * 4
    assert len(replicas.to("cand")) == 1  # one copy held by the only worker, one queued, two dropped
    text = gw.last_metrics
    assert metric(text, "tandem:shadow_requests_total", candidate="cand", outcome="dropped") == 2
    assert metric(text, "tandem:shadow_requests_total", candidate="cand", outcome="mirrored") == 2


def test_a_failing_candidate_never_reaches_the_client_nor_the_incumbents_breaker():
    replicas = Replicas(candidate_status=500)
    gw = gateway(replicas, min_samples={"errors": 2, "latency": 2, "accuracy": 1})
    responses = asyncio.run(serve(gw, [BODY, {**BODY, "stream": True}, BODY], drained))
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert gw.dispatcher.breakers.mode("inc") is BreakerMode.CLOSED
    assert gw.dispatcher.breakers.mode("cand") is BreakerMode.CLOSED  # mirrors are not routed traffic
    assert metric(gw.last_metrics, "tandem:gateway_requests_total", variant="cand", code="500") == 0
    assert metric(gw.last_metrics, "tandem:gateway_requests_total", variant="inc", code="200") == 3
    pairs = gw.shadow.pairs.snapshot()
    assert len(pairs) == 3 and all(p.candidate_failed for p in pairs)
    decision = gw.shadow.tick(0.0)  # the control loop's tick
    assert decision is not None and gw.shadow.gate.state is GateState.FAILED
    assert "errors" in decision.reason
    assert all(r.state == "draining" for r in gw.fleet.backend.list() if r.variant == "cand")  # retired
    assert "cand" not in gw.fleet.controller.pools and gw.fleet.controller.primary == "inc"


def test_nothing_is_mirrored_while_no_candidate_replica_is_ready_or_after_the_gate_decided():
    replicas = Replicas()
    gw = gateway(replicas, min_samples={"errors": 1, "latency": 2, "accuracy": 1})
    gw.fleet.backend.stop(next(r.replica_id for r in gw.fleet.backend.list() if r.variant == "cand"))
    asyncio.run(serve(gw, [BODY]))
    assert replicas.to("cand") == []
    gw.fleet.controller.tick()  # a new candidate replica
    gw.fleet.controller.tick()
    gw.shadow.gate.abandon(0.0, "an operator said so")
    asyncio.run(serve(gw, [BODY]))
    assert replicas.to("cand") == []


def gated(auto_promote: bool = True, profiles: bool = True) -> Gateway:
    raw = deployment(min_samples={"errors": 2, "latency": 2, "accuracy": 2}, auto_promote=auto_promote)
    if profiles:  # the same measured capacity and price on both sides: the cost verdict passes
        for v in raw["variants"]:
            v["profile"] = json.loads(profile("same").to_json())
    gw = build_gateway(parse_deployment(raw), FakeBackend(clock=lambda: 0.0), transport=httpx.MockTransport(Replicas()))
    gw.fleet.controller.tick()
    gw.fleet.controller.tick()
    for i in range(3):  # identical latencies and tokens
        gw.shadow.pairs.add(agreeing(i, positions=10, agree=10))
    return gw


def test_without_profiles_the_gate_cannot_judge_cost_and_keeps_shadowing():
    gw = gated(profiles=False)
    assert gw.shadow.tick(0.0) is None and gw.shadow.gate.state is GateState.SHADOWING
    assert gw.shadow.gate.verdict.metrics["cost"].verdict == "INCONCLUSIVE"
    assert gw.fleet.controller.rollout is None


def test_a_pass_promotes_the_candidate_through_a_rollout():
    gw = gated()
    decision = gw.shadow.tick(0.0)
    assert decision is not None and gw.shadow.gate.state is GateState.DONE, gw.shadow.view()
    assert gw.fleet.controller.rollout is not None and gw.fleet.controller.rollout.new == "cand"
    assert metric_text(gw, "tandem:gate_decisions_total", candidate="cand", verdict="PASS") == 1
    assert metric_text(gw, "tandem:gate_state", candidate="cand") == 5
    view = gw.shadow.view()
    assert [d["to"] for d in view["decisions"]] == ["passed", "promoting", "done"]
    assert view["verdict"]["verdict"] == "PASS" and view["rollout"]["new"] == "cand"
    assert view["decisions"][0]["evidence"]["pairs"] == 3


def test_without_auto_promote_a_pass_waits_for_the_operator():
    gw = gated(auto_promote=False)
    assert gw.shadow.tick(0.0) is not None and gw.shadow.gate.state is GateState.PASSED
    assert gw.fleet.controller.rollout is None and "cand" in gw.fleet.controller.pools  # kept, ready to promote

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(create_gateway_app(gw)), base_url="http://g") as c:
            return await c.post("/admin/gate/promote"), await c.post("/admin/gate/promote")

    first, again = asyncio.run(main())
    assert first.status_code == 202 and first.json()["to"] == "done"
    assert again.status_code == 409 and again.json()["error"]["code"] == "gate_not_passed"
    assert gw.fleet.controller.rollout is not None and gw.fleet.controller.rollout.new == "cand"


def metric_text(gw: Gateway, name: str, **labels: str) -> float:
    from prometheus_client import generate_latest

    return metric(generate_latest(gw.registry).decode(), name, **labels)


def test_the_gate_block_is_checked():
    raw = deployment()
    raw["gate"]["candidate"] = "nope"
    with pytest.raises(DeploymentError, match="gate.candidate: no variant is called 'nope'"):
        parse_deployment(raw)
    raw["gate"]["candidate"] = "inc"
    with pytest.raises(DeploymentError, match="'inc' is the primary"):
        parse_deployment(raw)
    raw = deployment(tolerances={"latency_p95": -1})
    with pytest.raises(DeploymentError, match="gate.tolerances.latency_p95"):
        parse_deployment(raw)


def test_admin_gate_is_a_404_without_a_gate():
    raw = deployment()
    del raw["gate"]
    gw = build_gateway(parse_deployment(raw), FakeBackend(clock=lambda: 0.0), transport=httpx.MockTransport(Replicas()))

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(create_gateway_app(gw)), base_url="http://g") as c:
            return await c.get("/admin/gate")

    response = asyncio.run(main())
    assert response.status_code == 404 and response.json()["error"]["code"] == "no_gate"


def test_chat_requests_are_mirrored_too():
    replicas = Replicas()
    gw = gateway(replicas)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}

    async def main():
        app = create_gateway_app(gw)
        gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport)
        gw.shadow.start(gw.upstream.client)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            response = await client.post("/v1/chat/completions", json=chat)
            await gw.shadow.mirror.drain()
        await gw.shadow.aclose()
        await gw.upstream.client.aclose()
        return response

    assert asyncio.run(main()).status_code == 200
    (copy,) = [body for host, body, _ in replicas.seen if host.startswith("cand")]
    assert copy == chat
    (pair,) = gw.shadow.pairs.snapshot()
    assert pair.path == "/v1/chat/completions" and pair.sampling.greedy and pair.note is not None
