"""The kpa policy against Knative's documented KPA behaviour: stable/panic windows, no scale-down
while panicking, scale to zero after the grace period, activation from zero (fake clock, no sleeping)."""

from __future__ import annotations

import pytest

from tandem.schedule.policies import KpaParams, PolicyState, ScaleContext, kpa, kpa_limits

from .helpers import spread

PARAMS = KpaParams()  # target 100 x 70% = 70 per replica, 60 s stable, 6 s panic, 200% threshold, 30 s grace


class Run:
    """Drives kpa one tick at a time; the test says how many replicas are ready."""

    def __init__(self, limits=kpa_limits(min_replicas=0, max_replicas=100), params=PARAMS, current=1) -> None:
        self.limits, self.params, self.current, self.state = limits, params, current, PolicyState()

    def tick(self, now: float, in_flight: int, ready: int | None = None, buffered: int = 0) -> int:
        ready = self.current if ready is None else ready
        ctx = ScaleContext(
            now, "v", self.current, ready, spread(in_flight, ready) if ready else (), self.limits, self.state,
            buffered=buffered if ready else buffered + in_flight,
        )  # fmt: skip
        self.current, self.state = kpa(ctx, self.params)
        return self.current


def test_defaults_are_knatives():
    assert PARAMS.target == pytest.approx(70.0)
    assert PARAMS.panic_window_s == pytest.approx(6.0)
    limits = kpa_limits()
    assert (limits.max_scale_up_rate, limits.max_scale_down_rate, PARAMS.scale_to_zero_grace_s) == (1000.0, 2.0, 30.0)


def test_stable_mode_targets_average_concurrency():
    run = Run(current=2)
    for t in range(0, 120, 2):
        desired = run.tick(t, 140)
    assert desired == 2  # 140 / 70
    for t in range(120, 300, 2):
        desired = run.tick(t, 300)
    assert desired == 5  # ceil(300 / 70)
    assert run.state.panic_since is None


def test_panic_starts_at_twice_the_ready_capacity_and_never_scales_down():
    run = Run(current=2)
    for t in range(0, 60, 2):
        run.tick(t, 140)
    assert run.state.panic_since is None
    # Burst at t=60: panic window (54, 60] averages (140 + 140 + 560) / 3 = 280 -> 4 replicas = 2 x ready.
    assert run.tick(60, 560, ready=2) == 4
    assert run.state.panic_since == 60
    # Still over the threshold while the new replicas start: the ratchet only rises.
    assert run.tick(62, 560, ready=2) >= 4
    last_over = None
    desired_while_panicking = []
    for t in range(64, 74, 2):
        desired_while_panicking.append(run.tick(t, 560, ready=2))
        last_over = run.state.panic_since
    assert desired_while_panicking == sorted(desired_while_panicking)  # never decreases
    peak = desired_while_panicking[-1]
    assert peak == 8  # ceil(560 / 70)
    # The burst ends; the new replicas are ready. No scale-down for a whole stable window after the
    # last tick that was over the threshold...
    t = 74
    while t <= last_over + 60:
        assert run.tick(t, 0, ready=peak) == peak
        assert run.state.panic_since == last_over
        t += 2
    # ...then panic ends and the stable count applies, halving at most (max-scale-down-rate 2).
    assert run.tick(t, 0, ready=peak) == peak // 2
    assert run.state.panic_since is None and run.state.max_panic_replicas == 0


def test_scale_to_zero_after_stable_window_and_grace_period():
    run = Run(current=1)
    for t in range(0, 101, 2):
        assert run.tick(t, 10) == 1
    # Last request seen at t=100. The stable window still averages > 0 until t=160; from then
    # the last replica waits out the 30 s grace period: zero at t=190.
    for t in range(102, 190, 2):
        assert run.tick(t, 0) == 1, t
    assert run.state.zero_since == 160
    assert run.tick(190, 0) == 0
    assert run.tick(192, 0, ready=0) == 0


def test_buffered_requests_at_zero_scale_up_at_once():
    run = Run(current=0)
    for t in range(0, 60, 2):
        assert run.tick(t, 0, ready=0) == 0
    assert run.tick(60, 0, ready=0, buffered=1) == 1  # one buffered request activates a replica
    run = Run(current=0)
    for t in range(0, 60, 2):
        run.tick(t, 0, ready=0)
    # A burst of 500 at zero: the panic window averages 500/3 -> ceil(166.7/70) = 3 replicas at once.
    assert run.tick(60, 0, ready=0, buffered=500) == 3
    assert run.state.panic_since == 60


def test_grace_period_restarts_when_traffic_returns():
    run = Run(current=1)
    for t in range(0, 180, 2):
        run.tick(t, 0)
    assert run.state.zero_since is not None
    run.tick(180, 5)
    assert run.state.zero_since is None and run.current == 1


def test_scale_down_rate_halves_at_most():
    run = Run(limits=kpa_limits(min_replicas=1, max_replicas=100), current=8)
    assert run.tick(0, 0) == 4
    assert run.tick(2, 0) == 2
    assert run.tick(4, 0) == 1
    assert run.tick(6, 0) == 1  # min_replicas 1: never zero


def test_min_replicas_disables_scale_to_zero():
    run = Run(limits=kpa_limits(min_replicas=1, max_replicas=10), current=1)
    for t in range(0, 400, 2):
        assert run.tick(t, 0) == 1


def test_bad_params_are_refused():
    with pytest.raises(ValueError):
        KpaParams(target_utilization=0)
    with pytest.raises(ValueError):
        KpaParams(panic_threshold_pct=100)
