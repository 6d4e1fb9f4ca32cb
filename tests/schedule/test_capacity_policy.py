"""The capacity policy: replicas = predicted token demand / the Profile's capacity at the latency SLO."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest

from tandem.schedule.policies import (
    CapacityParams,
    PolicyState,
    ScaleContext,
    ScaleLimits,
    TokenDemand,
    capacity,
    slo_capacity,
)

from .helpers import profile, spread

# Measured decode throughput by batch: per-sequence rate 20, 15, 10 (at 8), 6 tokens/s.
SLOW = profile({1: 20.0, 4: 60.0, 8: 80.0, 16: 96.0}, cold_start_s=10.0)
FAST = profile({1: 40.0, 4: 140.0, 8: 240.0, 16: 320.0}, cold_start_s=10.0)  # a faster recipe
WIDE = ScaleLimits(min_replicas=1, max_replicas=100, max_scale_up_rate=1000, max_scale_down_rate=1000)
PARAMS = CapacityParams(tpot_slo_s=0.1, horizon_s=0.0)  # 10 tokens/s per sequence; no forecast


def decide(demand: float, prof=SLOW, params=PARAMS, current=1, in_flight=0, state=PolicyState(), now=0.0, limits=WIDE):
    ctx = ScaleContext(
        now, "v", current, current, spread(in_flight, current), limits, state, TokenDemand(0.0, demand), profile=prof
    )
    return capacity(ctx, params)


def test_slo_capacity_is_the_largest_batch_meeting_the_slo():
    cap = slo_capacity(SLOW, tpot_slo_s=0.1)
    assert (cap.batch, cap.output_tokens_per_s, cap.meets_slo) == (8, 80.0, True)  # 80 / 8 = 10 tokens/s each
    cap = slo_capacity(SLOW, tpot_slo_s=0.05)  # 20 tokens/s each: only batch 1
    assert (cap.batch, cap.output_tokens_per_s) == (1, 20.0)
    cap = slo_capacity(SLOW, tpot_slo_s=0.01)  # 100 tokens/s each: nothing meets it
    assert cap.meets_slo is False and cap.batch == 1


@pytest.mark.parametrize("demand", [0.0, 10.0, 80.0, 81.0, 250.0, 799.0, 800.0])
def test_desired_is_ceil_demand_over_capacity(demand):
    assert decide(demand, current=max(1, math.ceil(demand / 80)))[0] == max(1, math.ceil(demand / 80))


def test_a_faster_variant_needs_fewer_replicas_for_the_same_traffic():
    slow, _ = decide(960.0, prof=SLOW)
    fast, _ = decide(960.0, prof=FAST)
    assert (slow, fast) == (12, 3)  # 960 / 80 (batch 8) and 960 / 320 (batch 16 still meets the SLO)


def test_queued_requests_count_as_demand():
    # The served rate saturates at capacity (2 replicas x 80); 40 in flight need 40 x 10 tokens/s.
    assert decide(160.0, current=2, in_flight=40)[0] == 5


def test_prompt_tokens_cost_prefill_time():
    prof = profile({1: 20.0, 8: 80.0}, prefill=1000.0)
    ctx = ScaleContext(0.0, "v", 1, 1, (), WIDE, PolicyState(), TokenDemand(150.0, 80.0), profile=prof)
    # 150/80 prompt tokens per output token: batch 8 takes 8/80 + 8 x 150/80/1000 = 0.115 s per token, over
    # the SLO; batch 4 (45.7 tokens/s) takes 0.095 s. Busy: 80/45.7 decode + 150/1000 prefill = 1.9.
    assert capacity(ctx, PARAMS)[0] == 2
    assert slo_capacity(prof, 0.1).batch == 8 and slo_capacity(prof, 0.1, 150 / 80).batch == 4


def test_prefill_beside_decode_shrinks_the_slo_batch():
    prof = profile({1: 20.0, 8: 80.0}, prefill=1000.0)
    ctx = ScaleContext(0.0, "v", 1, 1, (), WIDE, PolicyState(), TokenDemand(1500.0, 80.0), profile=prof)
    # 18.75 prompt tokens per output token: only batch 1 keeps 0.1 s per token (0.05 + 0.019), so 80 output
    # tokens/s need 4 replicas of decode time plus 1.5 of prefill: 6, where decode alone said 3.
    desired, state = capacity(ctx, PARAMS)
    assert desired == 6 and state.mix == pytest.approx(18.75)


def test_forecast_scales_ahead_of_a_ramp_over_the_cold_start():
    params = CapacityParams(tpot_slo_s=0.1, level_time_s=3.0, trend_time_s=6.0)  # horizon = cold start, 10 s
    policy = functools.partial(capacity, params=params)
    state, current = PolicyState(), 1
    ahead = []
    for t in range(0, 60, 2):
        demand = 8.0 * t  # +8 tokens/s every second
        ctx = ScaleContext(float(t), "v", current, current, (), WIDE, state, TokenDemand(0.0, demand), profile=SLOW)
        current, state = policy(ctx)
        ahead.append(current - max(1, math.ceil(demand / 80)))
    assert all(a >= 0 for a in ahead)  # never below the present demand
    assert sum(ahead[-10:]) >= 5  # and ahead of it once the trend is learned (10 s x 8/s^2 = 1 replica)


def test_scale_down_is_stabilized_for_60_s():
    params = CapacityParams(tpot_slo_s=0.1, horizon_s=0.0, level_time_s=0.0)  # no smoothing lag
    state, current = PolicyState(), 1
    history = []
    for t in range(0, 200, 5):
        demand = 800.0 if t < 50 else 80.0
        current, state = decide(demand, params=params, current=current, state=state, now=float(t))
        history.append((t, current))
    by_time = dict(history)
    assert by_time[45] == 10 and by_time[100] == 10  # the last high recommendation (t=45) is in the window
    assert by_time[105] == 1


def test_smoothing_lags_on_the_way_down():
    state, current = PolicyState(), 10
    for t in range(0, 50, 5):
        current, state = decide(800.0, current=current, state=state, now=float(t))
    # A time constant of 5 s / ln 2: one 5 s tick moves the level halfway.
    params = CapacityParams(tpot_slo_s=0.1, horizon_s=0.0, scale_down_stabilization_s=0, level_time_s=5 / math.log(2))
    current, state = decide(80.0, params=params, current=current, state=state, now=50.0)
    assert current == 6  # the level is halfway down: 440 tokens/s, not 80


def test_persistent_minimum_tier_holds_when_idle():
    params = CapacityParams(tpot_slo_s=0.1, horizon_s=0.0, min_tier_tokens_per_s=200.0, scale_down_stabilization_s=0)
    assert decide(0.0, params=params, current=5)[0] == 3  # ceil(200 / 80) however quiet
    assert decide(0.0, prof=FAST, params=params, current=5)[0] == 1  # the faster recipe's tier is smaller


def test_limits_apply_last():
    limits = ScaleLimits(min_replicas=2, max_replicas=6, max_scale_up_rate=2.0, max_scale_down_rate=2.0)
    assert decide(10_000.0, current=2, limits=limits)[0] == 4  # at most doubles per decision
    assert decide(10_000.0, current=4, limits=limits)[0] == 6  # at most max_replicas
    params = CapacityParams(tpot_slo_s=0.1, horizon_s=0.0, scale_down_stabilization_s=0)
    assert decide(0.0, current=6, limits=limits, params=params)[0] == 3  # at most halves


def test_needs_a_profile():
    ctx = ScaleContext(0.0, "v", 1, 1, (), WIDE, PolicyState())
    with pytest.raises(ValueError, match="Profile"):
        capacity(ctx, PARAMS)


def test_a_paged_kv_budget_caps_the_slo_batch():
    prof = replace(profile({1: 20.0, 4: 60.0, 8: 80.0, 16: 96.0}), kv_cache_tokens=4000)
    assert slo_capacity(prof, 0.1).batch == 8  # slots and speed alone
    assert slo_capacity(prof, 0.1, tokens_per_sequence=1000).batch == 4  # 4000 tokens hold 4 such sequences
    assert slo_capacity(SLOW, 0.1, tokens_per_sequence=1000).batch == 8  # no paged budget: slots only


def burst_series(params, seconds=600, burst=(200, 210)):
    """Work arriving at 1 replica's worth, and 10x that for 10 s; returns (time, desired) per 2 s tick."""
    policy = functools.partial(capacity, params=params)
    state, current, out = PolicyState(), 1, []
    for t in range(0, seconds, 2):
        scale = 10.0 if burst[0] <= t < burst[1] else 1.0
        demand = TokenDemand(0.0, 80.0 * scale, 0.8 * scale)  # 100 output tokens per request, SLOW's capacity 80
        ctx = ScaleContext(float(t), "v", current, current, (), WIDE, state, demand, profile=SLOW)
        current, state = policy(ctx)
        out.append((t, current))
    return out


def test_with_a_ttft_slo_the_fleet_keeps_room_for_the_bursts_it_has_seen():
    quick = {"tpot_slo_s": 0.1, "horizon_s": 0.0, "level_time_s": 5.0}
    plain = dict(burst_series(CapacityParams(**quick)))
    aware = dict(burst_series(CapacityParams(**quick, ttft_slo_s=2.0, burst_memory_s=200)))
    assert plain[200] == 10  # the plain forecast follows the burst while it lasts
    # The burst-aware one does not chase it (a 10 s burst does not move the robust line) but takes what its
    # forecast missed as headroom within a tick (the arrival estimate is smoothed over 2 s): 10 replicas' work
    # for 10 s needs 10 x 10 s / (10 s + 1.5 s queueing) = 8.7 replicas, 7.7 more than the forecast of 1
    assert aware[202] >= 8
    assert plain[340] == 1  # then the plain forecast forgets it after its 60 s stabilization ...
    assert aware[340] >= 8  # ... while the burst-aware one is ready for the next
    # and lets it go once the burst is older than its memory (to 1 replica's work + v2's square-root staffing
    # margin, 1 x sqrt(1 / batch 8) = 0.35 of a replica: 2)
    assert aware[598] == 2


def test_burst_room_shrinks_with_a_looser_ttft_slo():
    tight = dict(burst_series(CapacityParams(tpot_slo_s=0.1, horizon_s=0.0, level_time_s=5.0, ttft_slo_s=2.0)))
    loose = dict(burst_series(CapacityParams(tpot_slo_s=0.1, horizon_s=0.0, level_time_s=5.0, ttft_slo_s=20.0)))
    assert loose[340] < tight[340]  # a queue may absorb more of the burst: 10 s x 10 / (10 s + 10 s) = 5


def short_burst_series(params, counters, seconds=400, burst=(200, 204)):
    """1 replica's work arriving (0.8 requests/s of 100 output tokens), 10x that for 4 s. The gateway's demand
    window is 10 s; with `counters` it also reports its running arrival totals. (time, desired) per 2 s tick."""
    policy = functools.partial(capacity, params=params)
    state, current, out = PolicyState(), 1, []
    rate = lambda t: 0.8 * (10.0 if burst[0] <= t < burst[1] else 1.0)  # noqa: E731
    total = lambda t: sum(rate(s) for s in range(0, int(t)))  # noqa: E731  requests arrived before t
    for t in range(0, seconds, 2):
        window = (total(t) - total(max(t - 10, 0))) / 10.0
        demand = TokenDemand(0.0, 100.0 * window, window, arrived_requests_per_s=window,
                             arrived_prompt_tokens_per_s=0.0,
                             arrived_requests_total=round(total(t)) if counters else None,
                             arrived_prompt_tokens_total=0 if counters else None)  # fmt: skip
        ctx = ScaleContext(float(t), "v", current, current, (), WIDE, state, demand, profile=SLOW)
        current, state = policy(ctx)
        out.append((t, current))
    return dict(out)


def test_the_arrival_counters_show_a_burst_shorter_than_the_demand_window_at_its_height():
    # 10 replicas' work for 4 s, a queue absorbing 1.5 s of it: 10 x 4 / (4 + 1.5) = 7.3 replicas, 6.3 beyond the
    # forecast. The 10 s window spreads the same burst over 10 s at 4.6x: 4.6 x 10 / 11.5 = 4 replicas, 3 beyond.
    params = CapacityParams(tpot_slo_s=0.1, horizon_s=0.0, ttft_slo_s=2.0, burst_memory_s=300)
    ticks, windows = short_burst_series(params, True), short_burst_series(params, False)
    assert ticks[198] == windows[198] == 2  # before the burst: 1 replica's work + square-root staffing
    assert ticks[220] >= 8 and windows[220] <= 6  # the room the burst left behind
    assert ticks[398] == ticks[220]  # held for the next, within the memory


def test_paced_room_counts_a_bursts_prompts_at_the_gateways_pace():
    from tandem.schedule.policies.capacity import _paced_cost

    prof = profile({1: 25.0, 16: 400.0}, prefill=5000.0)  # 40 ms an iteration: the pace is 60% of 5,000 tokens/s
    cap = slo_capacity(prof, 0.1)
    # 2 replicas' work, 1 of them prefilling 5,000 tokens/s: that one costs 1 / 0.6 replicas at the pace
    assert _paced_cost(prof, cap, 0.1, 5000.0, 2.0) == pytest.approx((1 + 1 / 0.6) / 2)
    assert _paced_cost(prof, cap, 0.1, 0.0, 2.0) == 1.0  # no prompts: no dearer
    assert _paced_cost(profile({1: 25.0}), cap, 0.1, 5000.0, 2.0) == 1.0  # no prefill rate measured
