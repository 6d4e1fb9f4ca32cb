"""The capacity policy's live inputs at the gateway (tandem.gateway.slo_admission, DemandObserver): the SLO
admission around the router, arrivals with estimated prompt tokens, the SLO outcome of each answer, and the
replicas' prompt tokens still to prefill read from GET /load. Fakes only: a FakeBackend, an httpx
MockTransport, a fake clock; nothing sleeps."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from tandem.cluster.fake import FakeBackend
from tandem.contracts import Profile, ReplicaLoad
from tandem.deployment import parse_deployment
from tandem.gateway.app import create_gateway_app
from tandem.gateway.loads import parse_load
from tandem.gateway.observers import DemandObserver, estimate_prompt_tokens
from tandem.gateway.slo_admission import SloAdmission
from tandem.gateway.wiring import build_gateway
from tandem.schedule.policies import CapacityParams, TokenDemand
from tandem.schedule.routers import LeastOutstanding, RouteRequest
from tandem.schedule.traffic import DemandMeter

# 40 ms of decode per iteration at any batch up to 16, prefill at 5,000 tokens/s; TPOT 100 ms, TTFT 5 s.
PROFILE = Profile("int8", "cpu", "m", 1, 1, 16, {1: 25.0, 16: 400.0}, 5000.0, 0.05, 3.0)
PARAMS = CapacityParams(tpot_slo_s=0.1, ttft_slo_s=5.0)
CODE = TokenDemand(prompt_tokens_per_s=2000.0, output_tokens_per_s=30.0, requests_per_s=1.0)  # 2k prompts, 30 out


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def _idle(*ids: str) -> list[ReplicaLoad]:
    return [ReplicaLoad(i, "local", "v", 1, 0, 0.0, True) for i in ids]


def test_a_burst_of_long_prompts_waits_at_the_gateway_and_goes_as_the_pace_allows():
    clock = Clock()
    router = SloAdmission(LeastOutstanding(), lambda v: PROFILE, lambda v, now: CODE, PARAMS, clock)
    loads = _idle("a", "b")
    sent = [router.choose(RouteRequest(prompt_tokens=2000), loads) for _ in range(4)]
    assert [s.replica_id if s else None for s in sent] == ["a", "b", None, None]  # one prompt each: the pace
    clock.now += 2000 / 3000  # a's and b's prompts paid off at the pace of 3,000 tokens/s (40 ms of 100 ms)
    assert router.choose(RouteRequest(prompt_tokens=2000), loads) is not None


def test_nothing_is_capped_without_a_profile_or_a_mix_and_limits_are_remade_once_a_tick():
    clock, mix = Clock(), [TokenDemand()]
    unmeasured = SloAdmission(LeastOutstanding(), lambda v: None, lambda v, now: CODE, PARAMS, clock)
    assert all(unmeasured.choose(RouteRequest(prompt_tokens=4000), _idle("a")) for _ in range(5))
    router = SloAdmission(LeastOutstanding(), lambda v: PROFILE, lambda v, now: mix[0], PARAMS, clock, refresh_s=2.0)
    assert all(router.choose(RouteRequest(prompt_tokens=4000), _idle("a")) for _ in range(5))  # no mix yet
    mix[0] = CODE
    assert router.choose(RouteRequest(prompt_tokens=4000), _idle("a"))  # the limits are a tick old: unchanged
    clock.now = 2.0
    assert router.choose(RouteRequest(prompt_tokens=4000), _idle("a")) is not None  # paid off: the first goes
    assert router.choose(RouteRequest(prompt_tokens=4000), _idle("a")) is None  # and holds the next back
    full = [ReplicaLoad("a", "local", "v", 20, 0, 0.0, True)]
    clock.now = 100.0
    assert router.choose(RouteRequest(prompt_tokens=10), full) is None  # over the SLO batch's request cap


def test_the_demand_observer_counts_arrivals_and_judges_answers_against_the_slo():
    clock, meter = Clock(), DemandMeter()
    observer = DemandObserver(meter, lambda: "v", clock, slo=(1.0, 0.1))
    assert estimate_prompt_tokens({"messages": [{"content": "x" * 400}, {"content": "y" * 39}]}) == 110
    fast = observer.request("/v1/completions", {"prompt": "p" * 80, "stream": True}, {})
    fast.attempt("http://r", True, 0.0)
    clock.now = 0.5
    fast.chunk(b"data: {}\n\n", 0.5)  # first token at 0.5 s
    fast.chunk(b"data: {}\n\ndata: {}\n\ndata: [DONE]\n\n", 0.7)  # 2 more tokens in 0.2 s: 100 ms each
    fast.done("v", 0.7)
    late = observer.request("/v1/completions", {"prompt": "p"}, {})  # whole: 3 s for 5 tokens > 1 + 4 x 0.1
    late.attempt("http://r", False, 0.0)
    late.chunk(b'{"usage": {"prompt_tokens": 1, "completion_tokens": 5}}', 3.5)
    late.done("v", 3.5)
    refused = observer.request("/v1/completions", {"prompt": "p"}, {})
    refused.done(None, 4.0)  # the gateway answered itself (no replica): a miss
    left = observer.request("/v1/completions", {"prompt": "p"}, {})
    left.cancelled()  # the client left: not judged
    rate = meter.rate("v", 5.0)
    assert rate.arrived_requests_total == 4 and rate.arrived_prompt_tokens_total == 20
    assert rate.slo_attainment == 1 / 3


def test_a_capacity_deployment_with_a_ttft_slo_feeds_its_policy_through_the_proxy():
    profile = {"recipe": "int8", "hardware": "cpu", "model": "m", "weight_bytes": 1, "kv_bytes_per_token": 1,
               "max_slots": 16, "decode_tokens_per_s": {"1": 25.0, "16": 400.0}, "prefill_tokens_per_s": 5000.0,
               "ttft_s_p50": 0.05, "cold_start_s": 3.0}  # fmt: skip
    raw = {"variants": [{"name": "v", "recipe": "int8", "replicas": {"min": 1, "max": 2}, "profile": profile}],
           "policy": {"name": "capacity", "params": {"ttft_slo_s": 5.0, "tpot_slo_s": 0.1}}}  # fmt: skip
    ok = {"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    clock = Clock(10.0)
    gw = build_gateway(parse_deployment(raw), FakeBackend(clock=clock), clock=clock,
                       transport=httpx.MockTransport(lambda r: httpx.Response(200, json=ok)))  # fmt: skip
    gw.fleet.controller.tick()
    gw.fleet.controller.tick()
    assert isinstance(gw.dispatcher.router, SloAdmission)

    async def post() -> httpx.Response:
        app = create_gateway_app(gw)
        gw.upstream.client = httpx.AsyncClient(transport=gw.upstream.transport)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
            response = await client.post("/v1/completions", json={"model": "m", "prompt": "q" * 400})
        await gw.upstream.client.aclose()
        return response

    assert asyncio.run(post()).status_code == 200
    demand = gw.fleet.demand.rate("v", clock())
    assert demand.arrived_requests_total == 1 and demand.arrived_prompt_tokens_total == 100  # 400 characters / 4
    assert demand.slo_attainment == 1.0 and demand.requests_per_s > 0  # judged, and its tokens recorded
    hpa = build_gateway(parse_deployment({**raw, "policy": {"name": "hpa"}}), FakeBackend(clock=clock), clock=clock)
    assert not isinstance(hpa.dispatcher.router, SloAdmission)  # other policies: the router as configured


def test_a_replica_reports_its_prompt_tokens_still_to_prefill_and_the_router_sees_them():
    backend = FakeBackend(clock=lambda: 0.0)
    gw = build_gateway(parse_deployment({"variants": [{"name": "v"}], "policy": {"name": "hpa"}}), backend)
    gw.fleet.controller.tick()
    gw.fleet.controller.tick()
    replica = backend.list()[0]
    payload = {"replica_id": replica.replica_id, "running": 2, "waiting": 0, "kv_used": 0.1, "healthy": True,
               "prefill_tokens": 1234}  # fmt: skip
    gw.fleet.inflight.report(parse_load(replica, payload))
    assert gw.dispatcher.loads()[0].prefill_tokens == 1234
    older = {k: v for k, v in payload.items() if k != "prefill_tokens"}
    assert parse_load(replica, older).prefill_tokens == 0  # a replica that does not report it
