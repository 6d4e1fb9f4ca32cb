"""The real policies, router and controller replayed on the Azure LLM trace (CC-BY 4.0, Patel et al.,
Splitwise, ISCA 2024) and on synthetic bursts, on a virtual clock. Checks outcomes, never timings."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from tandem.contracts import Profile
from tandem.schedule.controller import ControllerConfig
from tandem.schedule.policies import (
    CapacityParams,
    HpaParams,
    KpaParams,
    ScaleLimits,
    StaticParams,
    apply_limits,
    capacity,
    hpa,
    kpa,
    kpa_limits,
    static_peak,
)
from tandem.schedule.variant import Variant
from tandem.sim import SimConfig, compress, load_trace, poisson_trace, simulate

LIMITS = ScaleLimits(min_replicas=1, max_replicas=10, max_scale_up_rate=2.0, max_scale_down_rate=2.0)
CONFIG = SimConfig(ttft_slo_s=2.0, tpot_slo_s=0.05, tail_s=300, warmup_s=0)
CAPACITY = functools.partial(capacity, params=CapacityParams(tpot_slo_s=0.05, ttft_slo_s=2.0, burst_memory_s=300))


def variant(speed: float = 1.0, cold_start_s: float = 30.0) -> Variant:
    """A GPU-class replica: per-sequence 50 tokens/s alone, 25 at batch 32, 17 at 64 (x speed)."""
    decode = {1: 50.0, 8: 320.0, 32: 800.0, 64: 1100.0}
    profile = Profile(
        recipe=f"sim-x{speed}",
        hardware="sim",
        model="sim",
        weight_bytes=1,
        kv_bytes_per_token=1,
        max_slots=64,
        decode_tokens_per_s={b: t * speed for b, t in decode.items()},
        prefill_tokens_per_s=20000.0 * speed,
        ttft_s_p50=0.1,
        cold_start_s=cold_start_s,
    )
    return Variant(f"x{speed}", profile.recipe, profile=profile)


@pytest.fixture(scope="module")
def trace():
    return load_trace(duration_s=600)  # the first 10 minutes: ~2900 requests, ~5 per second


def test_trace_loads_relative_times_and_windows(trace):
    assert 2500 < len(trace) < 3500
    assert trace[0].arrival_s == 0.0 and trace[-1].arrival_s < 600
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(trace, trace[1:], strict=False))
    later = load_trace(start_s=600, duration_s=60)
    assert later and all(0 <= r.arrival_s < 60 for r in later)
    assert compress(trace, 2.0)[-1].arrival_s == pytest.approx(trace[-1].arrival_s / 2)


def test_capacity_policy_serves_the_trace_within_the_slo_for_a_fraction_of_a_static_fleet(trace):
    config = replace(CONFIG, run_tail=True, warmup_s=120, tail_s=900)  # bursts are remembered for 300 s
    result = simulate(trace, variant(), CAPACITY, LIMITS, config=config, duration_s=600)
    assert (result.served, result.lost, result.unserved) == (len(trace), 0, 0)
    assert result.slo_attainment >= 0.99
    # vs 10 replicas all along (v1 asserted < 0.5; v2's attainment feedback and square-root staffing hold more
    # on this quiet, noisy ten minutes: see docs/planner.md)
    assert result.replica_seconds < 0.7 * LIMITS.max_replicas * 600
    assert result.timeline[-1][1] == LIMITS.min_replicas  # back to the floor once the traffic is gone


def test_a_faster_variant_needs_fewer_replicas_for_the_same_trace(trace):
    slow = simulate(trace, variant(1.0), CAPACITY, LIMITS, config=CONFIG)
    fast = simulate(trace, variant(2.0), CAPACITY, LIMITS, config=CONFIG)
    assert fast.lost == slow.lost == 0
    assert fast.peak < slow.peak
    assert fast.replica_seconds < 0.75 * slow.replica_seconds
    assert fast.slo_attainment >= slow.slo_attainment - 0.01


def test_hpa_on_the_trace_does_not_flap(trace):
    policy = functools.partial(hpa, params=HpaParams(target=32))
    result = simulate(trace, variant(), policy, LIMITS, config=CONFIG, policy_name="hpa")
    assert result.lost == 0 and result.unserved == 0
    assert sum(result.decisions.values()) <= 6  # tolerance + 300 s stabilization: a few decisions in 10 min
    # Scale-down only after 300 s without a higher recommendation: no drop within 300 s of a rise.
    rises = [t for (t, n, _), (_, m, _) in zip(result.timeline, result.timeline[1:], strict=False) if m > n]
    drops = [t for (t, n, _), (_, m, _) in zip(result.timeline, result.timeline[1:], strict=False) if m < n]
    assert all(d - r >= 300 for d in drops for r in rises if r < d)


def test_kpa_keeps_a_replica_while_traffic_flows_and_scales_to_zero_after(trace):
    policy = functools.partial(kpa, params=KpaParams(target_concurrency=40, target_utilization=0.8))
    config = replace(CONFIG, run_tail=True)
    result = simulate(trace, variant(), policy, kpa_limits(0, 10), config=config, policy_name="kpa", duration_s=600)
    assert result.lost == 0 and result.unserved == 0
    last = trace[-1].arrival_s
    serving = [n for t, n, _ in result.timeline if 60 <= t <= last]
    assert min(serving) >= 1  # requests keep arriving: never at zero
    zero_at = next(t for t, n, _ in result.timeline if t > last and n == 0)
    assert 60 + 30 <= zero_at - last <= 60 + 30 + 60  # stable window + grace (+ draining the last requests)


def burst_trace():
    base = poisson_trace(2.0, 300, prompt=500, output=200, seed=1)
    burst = poisson_trace(20.0, 60, prompt=500, output=200, seed=2, start_s=120)
    return sorted(base + burst, key=lambda r: r.arrival_s)


def test_kpa_panics_on_a_burst_and_comes_back_down():
    policy = functools.partial(kpa, params=KpaParams(target_concurrency=40, target_utilization=0.8))
    config = replace(CONFIG, run_tail=True)
    result = simulate(burst_trace(), variant(), policy, kpa_limits(1, 10), config=config, policy_name="kpa")
    before = [n for t, n, _ in result.timeline if t < 120]
    assert max(before) == 1 and result.peak >= 3
    assert result.timeline[-1][1] == 1 and result.lost == 0 and result.unserved == 0


def test_capacity_scales_one_to_n_and_back_on_a_burst():
    config = replace(CONFIG, run_tail=True, tail_s=900)  # it keeps room for a burst for 300 s after it
    result = simulate(burst_trace(), variant(), CAPACITY, LIMITS, config=config, policy_name="capacity")
    assert result.timeline[0][1] == 1 and result.peak >= 3 and result.timeline[-1][1] == 1
    assert result.decisions["up"] >= 1 and result.decisions["down"] >= 1
    assert result.lost == 0 and result.unserved == 0 and result.served == len(burst_trace())


def test_the_warm_up_replays_the_traffic_before_the_window_so_the_fleet_starts_sized(trace):
    cold = simulate(trace, variant(), CAPACITY, LIMITS, config=CONFIG)
    warm = simulate(trace, variant(), CAPACITY, LIMITS, config=replace(CONFIG, warmup_s=120))
    assert cold.timeline[0][1] == 1 < min(n for t, n, _ in warm.timeline if 0 <= t < 10)
    assert len(warm.requests) == len(cold.requests) == len(trace)  # warm-up requests are not judged
    assert warm.quantile("ttft", 0.99) <= cold.quantile("ttft", 0.99)


def test_cost_counts_only_the_window_and_packing_counts_nodes():
    trace = poisson_trace(2.0, 60, prompt=100, output=50, seed=3)
    policy = functools.partial(static_peak, params=StaticParams(3))
    limits = ScaleLimits(min_replicas=3, max_replicas=3)
    result = simulate(trace, variant(), policy, limits, config=CONFIG, duration_s=60, nodes_for=lambda n: -(-n // 2))
    assert result.replica_seconds == pytest.approx(3 * 60)
    assert result.node_seconds == pytest.approx(2 * 60)  # 3 replicas, 2 per node
    assert result.min_live == result.max_live == 3 and result.mean_replicas == pytest.approx(3)


def test_attainment_counts_time_to_first_token_not_only_time_per_token():
    trace = poisson_trace(8.0, 30, prompt=4000, output=20, seed=4)  # 1.6x the prefill rate: a queue of prompts
    policy = functools.partial(static_peak, params=StaticParams(1))
    result = simulate(trace, variant(), policy, ScaleLimits(1, 1), config=CONFIG, duration_s=30)
    assert result.lost == 0 and result.unserved == 0
    assert result.quantile("tpot", 0.5) <= CONFIG.tpot_slo_s  # each token comes fast once it starts ...
    assert result.quantile("ttft", 0.5) > CONFIG.ttft_slo_s  # ... but the prompts wait in line
    assert result.slo_attainment < 0.5


def test_a_replica_stopped_under_load_loses_its_requests_and_they_are_counted():
    trace = poisson_trace(10.0, 60, prompt=100, output=400, seed=5)
    hard_stop = replace(CONFIG, controller=ControllerConfig(drain_timeout_s=0.0))

    def shrink(ctx):  # 4 replicas, then 1 at once: the drained ones are stopped with requests on them
        return apply_limits(4 if ctx.now < 30 else 1, ctx, ctx.state)

    result = simulate(trace, variant(), shrink, ScaleLimits(1, 4, max_scale_down_rate=10), config=hard_stop)
    assert result.lost > 0 and result.served + result.lost + result.unserved >= len(result.requests)


def test_needs_a_profile():
    with pytest.raises(ValueError, match="Profile"):
        simulate([], Variant("v", "x"), CAPACITY, LIMITS)


def test_the_token_cap_holds_a_burst_of_long_prompts_back_to_protect_every_running_users_tpot():
    # 1,500-token prompts, 40-token answers; TPOT 40 ms. An iteration carrying a full 512-token chunk takes
    # 25.6 ms of prefill beside the rows' 20-25 ms: over the target. A burst meeting free slots fills them at once
    # with the request cap alone; the token budget lets a replica take the next prompt only as its prefill drains,
    # and its pace only as fast as its rows keep the TPOT: no row misses it, and a fleet of 2 too small for the
    # burst shows as TTFT (at the gateway), which a third replica absorbs.
    base = poisson_trace(1.0, 60, prompt=1500, output=40, seed=7)
    trace = sorted(base + poisson_trace(10.0, 4, prompt=1500, output=40, seed=8, start_s=30), key=lambda r: r.arrival_s)
    runs = {}
    for replicas, token_cap, pace in ((2, False, False), (2, True, False), (2, True, True), (3, True, True)):
        config = replace(CONFIG, admission_cap=True, token_cap=token_cap, pace=pace, ttft_slo_s=5.0, tpot_slo_s=0.04)
        policy = functools.partial(static_peak, params=StaticParams(replicas))
        runs[replicas, token_cap, pace] = simulate(trace, variant(), policy, ScaleLimits(replicas, replicas),
                                                   config=config, duration_s=60)  # fmt: skip
    request_cap, budget = runs[2, False, False], runs[2, True, False]
    paced, three = runs[2, True, True], runs[3, True, True]
    assert request_cap.quantile("tpot", 0.99) > 0.04 >= budget.quantile("tpot", 0.99)
    assert budget.slo_attainment >= 0.99 > request_cap.slo_attainment
    assert all(r.tpot_s <= 0.04 for r in paced.requests) and paced.quantile("ttft", 0.99) > 5.0
    assert three.slo_attainment == 1.0 and three.quantile("tpot", 0.99) < budget.quantile("tpot", 0.99)
    assert all(run.lost == run.unserved == 0 for run in runs.values())
