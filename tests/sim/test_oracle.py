"""The oracle's schedule on a tiny trace solved by hand."""

from __future__ import annotations

from tandem.contracts import Profile
from tandem.sim.oracle import oracle_schedule
from tandem.sim.trace import TraceRequest

# 25 tokens/s per sequence at any batch up to 16 (400 tokens/s a replica at the 0.1 s SLO), no prefill cost.
PROFILE = Profile(
    recipe="t", hardware="t", model="t", weight_bytes=1, kv_bytes_per_token=1, max_slots=16,
    decode_tokens_per_s={1: 25.0, 16: 400.0}, prefill_tokens_per_s=0.0, ttft_s_p50=0.1, cold_start_s=10.0,
)  # fmt: skip


def test_a_burst_is_spread_over_the_queueing_budget():
    # Window 0: 10 requests of 400 tokens, 10 replica-seconds; window 1: 100 of them, 100 replica-seconds.
    trace = [TraceRequest(i * 1.0, 1, 400) for i in range(10)]
    trace += [TraceRequest(10.0 + i * 0.1, 1, 400) for i in range(100)]
    starts, replicas = oracle_schedule(trace, PROFILE, 0.1, delay_s=5.0, duration_s=40.0)
    # n = ceil((backlog + work) / (10 s + 5 s)): 10/15 -> 1 (nothing left); 100/15 -> 7 (30 left, within
    # 7 x 5 s); 30/15 -> 2 (10 left); 10/15 -> 1.
    assert starts == (0.0, 10.0, 20.0, 30.0)
    assert replicas == (1, 7, 2, 1)


def test_a_margin_scales_the_work():
    trace = [TraceRequest(10.0 + i * 0.1, 1, 400) for i in range(100)]
    _, replicas = oracle_schedule(trace, PROFILE, 0.1, delay_s=5.0, duration_s=20.0, margin=1.5)
    assert replicas == (1, 10)  # 150 / 15
