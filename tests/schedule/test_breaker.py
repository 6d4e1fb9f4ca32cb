"""The circuit breaker: closed -> open (consecutive failures or a failure ratio) -> half-open -> closed."""

from __future__ import annotations

import pytest

from tandem.schedule.breaker import (
    BreakerBoard,
    BreakerConfig,
    BreakerMode,
    BreakerState,
    Outcome,
    admit,
    mode_at,
    record,
)

from .helpers import FakeClock

CONFIG = BreakerConfig(consecutive_failures=3, failure_ratio=0.5, window_s=10, min_calls=6, open_s=5)


def feed(outcomes, config=CONFIG, start=0.0, dt=0.1, state=BreakerState()):
    now = start
    for outcome in outcomes:
        state = record(state, config, now, outcome)
        now += dt
    return state


def test_trips_on_consecutive_failures_timeouts_included():
    state = feed([Outcome.FAILURE, Outcome.TIMEOUT])
    assert state.mode is BreakerMode.CLOSED
    state = feed([Outcome.FAILURE], state=state, start=1.0)
    assert state.mode is BreakerMode.OPEN and state.opened_at == 1.0


def test_a_success_resets_the_consecutive_count():
    state = feed([Outcome.FAILURE, Outcome.FAILURE, Outcome.SUCCESS, Outcome.FAILURE, Outcome.FAILURE])
    assert state.mode is BreakerMode.CLOSED


def test_trips_on_failure_ratio_over_the_window_once_min_calls_seen():
    pattern = [Outcome.FAILURE, Outcome.SUCCESS] * 2 + [Outcome.FAILURE]  # 3/5 failed, but only 5 calls
    state = feed(pattern)
    assert state.mode is BreakerMode.CLOSED
    state = feed([Outcome.SUCCESS], state=state, start=1.0)  # 3/6 = 0.5 >= 0.5
    assert state.mode is BreakerMode.OPEN


def test_old_outcomes_leave_the_window():
    state = feed([Outcome.FAILURE, Outcome.SUCCESS] * 3, dt=1.0)  # 3 failures of 6, but spread over 0..5 s
    assert state.mode is BreakerMode.OPEN
    state = feed([Outcome.FAILURE, Outcome.SUCCESS, Outcome.SUCCESS], dt=1.0)
    state = feed([Outcome.FAILURE, Outcome.SUCCESS, Outcome.SUCCESS], dt=1.0, start=20.0, state=state)
    assert state.mode is BreakerMode.CLOSED and len(state.outcomes) == 3


def test_open_refuses_then_half_opens_after_open_s():
    state = feed([Outcome.FAILURE] * 3)
    assert admit(state, CONFIG, 1.0)[0] is False
    assert mode_at(state, CONFIG, 5.19) is BreakerMode.OPEN
    assert mode_at(state, CONFIG, 5.2) is BreakerMode.HALF_OPEN
    allowed, probing = admit(state, CONFIG, 5.2)
    assert allowed and probing.mode is BreakerMode.HALF_OPEN and probing.probes_in_flight == 1
    assert admit(probing, CONFIG, 5.3)[0] is False  # one probe at a time


def test_half_open_closes_after_successes_and_reopens_on_a_failure():
    config = BreakerConfig(consecutive_failures=1, open_s=5, half_open_probes=1, half_open_successes=2)
    opened = record(BreakerState(), config, 0.0, Outcome.FAILURE)
    _, probing = admit(opened, config, 5.0)
    probing = record(probing, config, 5.1, Outcome.SUCCESS)
    assert probing.mode is BreakerMode.HALF_OPEN and probing.probe_successes == 1
    _, probing = admit(probing, config, 5.2)
    closed = record(probing, config, 5.3, Outcome.SUCCESS)
    assert closed == BreakerState()
    _, probing = admit(opened, config, 5.0)
    reopened = record(probing, config, 5.1, Outcome.TIMEOUT)
    assert reopened.mode is BreakerMode.OPEN and reopened.opened_at == 5.1


def test_abandoned_probe_frees_its_slot():
    _, probing = admit(feed([Outcome.FAILURE] * 3), CONFIG, 6.0)
    released = record(probing, CONFIG, 6.1, Outcome.ABANDONED)
    assert released.mode is BreakerMode.HALF_OPEN and released.probes_in_flight == 0
    assert admit(released, CONFIG, 6.2)[0] is True


def test_gauge_values():
    assert [m.gauge for m in (BreakerMode.CLOSED, BreakerMode.HALF_OPEN, BreakerMode.OPEN)] == [0, 1, 2]


def test_board_keeps_one_breaker_per_variant():
    clock = FakeClock()
    board = BreakerBoard(BreakerConfig(consecutive_failures=2, open_s=3), clock)
    for _ in range(2):
        assert board.admit("fast")
        board.record("fast", Outcome.FAILURE)
    assert board.mode("fast") is BreakerMode.OPEN and board.mode("baseline") is BreakerMode.CLOSED
    assert not board.admit("fast") and board.admit("baseline")
    clock.advance(3)
    assert board.mode("fast") is BreakerMode.HALF_OPEN and board.admit("fast")


def test_bad_config_is_refused():
    with pytest.raises(ValueError):
        BreakerConfig(failure_ratio=0)
    with pytest.raises(ValueError):
        BreakerConfig(consecutive_failures=0)
