"""The hpa policy against Kubernetes' documented HPA behaviour (fake clock, no sleeping)."""

from __future__ import annotations

import functools

import pytest

from tandem.schedule.policies import HpaParams, PolicyState, ScaleContext, ScaleLimits, hpa, hpa_limits

from .helpers import drive, spread

WIDE = ScaleLimits(min_replicas=1, max_replicas=100, max_scale_up_rate=1000, max_scale_down_rate=1000)


def decide(current: int, total: int, params=HpaParams(target=10), limits=WIDE, ready: int | None = None, now=0.0):
    ready = current if ready is None else ready
    ctx = ScaleContext(now, "v", current, ready, spread(total, ready), limits, PolicyState())
    return hpa(ctx, params)[0]


def test_desired_is_ceil_of_current_times_ratio():
    assert decide(2, 30) == 3  # ratio 1.5 -> ceil(2 x 1.5)
    assert decide(4, 13) == 2  # ratio 0.325 -> ceil(1.3)
    assert decide(3, 100) == 10


@pytest.mark.parametrize(("total", "expected"), [(108, 10), (92, 10), (110, 10), (90, 10), (112, 12), (88, 9)])
def test_tolerance_of_ten_percent(total, expected):
    # 10 replicas, target 10 each: a ratio within [0.9, 1.1] changes nothing.
    assert decide(10, total) == expected


def test_not_ready_replicas_count_as_idle_on_scale_up():
    # 2 ready at 15 each (ratio 1.5), 2 more starting: 30 / (4 x 10) = 0.75 reverses the direction -> hold.
    assert decide(4, 30, ready=2) == 4
    # 2 ready at 30 each: 60 / 40 = 1.5 -> ceil(1.5 x 4) = 6.
    assert decide(4, 60, ready=2) == 6


def test_no_ready_replicas_no_action():
    ctx = ScaleContext(0.0, "v", 2, 0, (), WIDE, PolicyState(), buffered=50)
    assert hpa(ctx, HpaParams(target=10))[0] == 2


def test_scale_down_waits_for_the_300_s_stabilization_window():
    policy = functools.partial(hpa, params=HpaParams(target=10))
    # High load until t=150 (asks for 8), then nearly idle (asks for 1); a tick every 15 s.
    series = [(t, 80 if t <= 150 else 5) for t in range(0, 900, 15)]
    steps = drive(policy, series, WIDE, start=8)
    by_time = {s.now: s.desired for s in steps}
    assert all(by_time[t] == 8 for t in range(0, 450, 15))  # the t=150 recommendation of 8 still counts
    assert by_time[450] == 1  # 300 s after the last high recommendation
    assert by_time[885] == 1


def test_scale_down_takes_the_highest_recommendation_in_the_window():
    # KEP-853's example: 10 replicas, one tick per minute, a 600 s window, recommendations
    # 10, 9, 8, 9, 9, 8, 9, 8, 9, 8 then 7: the count stays 10, then goes to 9 (the window's max).
    params = HpaParams(target=1, tolerance=0.0, scale_down_stabilization_s=600)
    state, current = PolicyState(), 10
    decisions = []
    for minute, rec in enumerate([10, 9, 8, 9, 9, 8, 9, 8, 9, 8, 7]):
        ctx = ScaleContext(minute * 60.0, "v", current, current, spread(rec, current), WIDE, state)
        current, state = hpa(ctx, params)
        decisions.append(current)
    assert decisions[:10] == [10] * 10
    assert decisions[10] == 9


def test_scale_up_is_immediate_but_rate_limited_by_default_behavior():
    limits = hpa_limits(min_replicas=1, max_replicas=50)
    params = HpaParams(target=10)
    # 2 replicas at 100 each want 20; the default allows max(2 x 2, 2 + 4) = 6 per 15 s.
    ctx = ScaleContext(0.0, "v", 2, 2, spread(200, 2), limits, PolicyState())
    desired, state = hpa(ctx, params)
    assert desired == 6
    # 5 s later (inside the 15 s period) no further scale-up...
    ctx = ScaleContext(5.0, "v", 6, 6, spread(600, 6), limits, state)
    held, state = hpa(ctx, params)
    assert held == 6
    # ...15 s after the last one, another doubling (6 -> 12).
    ctx = ScaleContext(15.0, "v", 6, 6, spread(600, 6), limits, state)
    assert hpa(ctx, params)[0] == 12


def test_min_and_max_replicas_bound_the_result():
    limits = ScaleLimits(min_replicas=2, max_replicas=4, max_scale_up_rate=1000, max_scale_down_rate=1000)
    assert decide(3, 1000, limits=limits) == 4
    assert decide(3, 0, limits=limits, params=HpaParams(target=10, scale_down_stabilization_s=0)) == 2


def test_kv_used_metric():
    params = HpaParams(metric="kv_used", target=0.5, scale_down_stabilization_s=0)
    from .helpers import loads

    ctx = ScaleContext(0.0, "v", 2, 2, loads(0, 0, kv=0.9), WIDE, PolicyState())
    assert hpa(ctx, params)[0] == 4  # ratio 1.8 -> ceil(3.6)


def test_bad_params_are_refused():
    with pytest.raises(ValueError):
        HpaParams(target=0)
    with pytest.raises(ValueError):
        HpaParams(metric="kv_used", target=2)
