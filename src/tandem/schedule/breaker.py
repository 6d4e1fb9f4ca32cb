"""A circuit breaker per variant, as a pure state machine: (state, config, now, event) -> state.

- CLOSED: requests flow. It trips OPEN on `consecutive_failures` failures in a row, or when at
  least `min_calls` outcomes in the last `window_s` seconds include a failure ratio >= `failure_ratio`.
  Timeouts count as failures.
- OPEN: nothing is admitted (the gateway sends requests to the fallback variant) for `open_s`.
- HALF_OPEN: after `open_s`, up to `half_open_probes` requests are let through at once; a failure
  re-opens the breaker, `half_open_successes` successes close it (with a fresh window).

`BreakerBoard` holds one state per variant with an injected clock, for the gateway's convenience.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = ["BreakerConfig", "BreakerMode", "BreakerState", "BreakerBoard", "Outcome", "admit", "record", "mode_at"]


class BreakerMode(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    @property
    def gauge(self) -> int:
        """The value of `tandem:breaker_state`: 0 closed, 1 half-open, 2 open."""
        return {BreakerMode.CLOSED: 0, BreakerMode.HALF_OPEN: 1, BreakerMode.OPEN: 2}[self]


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"  # counts as a failure
    ABANDONED = "abandoned"  # the client left before a verdict: releases a probe, counts for nothing

    @property
    def failed(self) -> bool:
        return self in (Outcome.FAILURE, Outcome.TIMEOUT)


@dataclass(frozen=True)
class BreakerConfig:
    consecutive_failures: int = 5
    failure_ratio: float = 0.5
    window_s: float = 30.0
    min_calls: int = 20
    open_s: float = 10.0
    half_open_probes: int = 1
    half_open_successes: int = 2

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.min_calls < 1 or self.half_open_probes < 1:
            raise ValueError("breaker counts (consecutive_failures, min_calls, half_open_probes) must be >= 1")
        if not 0 < self.failure_ratio <= 1 or self.window_s <= 0 or self.open_s < 0:
            raise ValueError("breaker needs failure_ratio in (0, 1], window_s > 0, open_s >= 0")
        if self.half_open_successes < 1:
            raise ValueError("half_open_successes must be >= 1")


@dataclass(frozen=True)
class BreakerState:
    mode: BreakerMode = BreakerMode.CLOSED
    consecutive_failures: int = 0
    outcomes: tuple[tuple[float, bool], ...] = ()  # (time, failed) while closed, oldest first
    opened_at: float | None = None
    probes_in_flight: int = 0
    probe_successes: int = 0


def mode_at(state: BreakerState, config: BreakerConfig, now: float) -> BreakerMode:
    """The mode as of `now`: an OPEN breaker whose `open_s` has passed reads HALF_OPEN."""
    if state.mode is BreakerMode.OPEN and state.opened_at is not None and now - state.opened_at >= config.open_s:
        return BreakerMode.HALF_OPEN
    return state.mode


def _half_open(state: BreakerState) -> BreakerState:
    return replace(state, mode=BreakerMode.HALF_OPEN, probes_in_flight=0, probe_successes=0)


def _open(now: float) -> BreakerState:
    return BreakerState(mode=BreakerMode.OPEN, opened_at=now)


def admit(state: BreakerState, config: BreakerConfig, now: float) -> tuple[bool, BreakerState]:
    """May a request go to this variant now? Admitting a half-open probe counts it in flight."""
    mode = mode_at(state, config, now)
    if mode is BreakerMode.CLOSED:
        return True, state
    if mode is BreakerMode.OPEN:
        return False, state
    if state.mode is BreakerMode.OPEN:
        state = _half_open(state)
    if state.probes_in_flight >= config.half_open_probes:
        return False, state
    return True, replace(state, probes_in_flight=state.probes_in_flight + 1)


def record(state: BreakerState, config: BreakerConfig, now: float, outcome: Outcome) -> BreakerState:
    """The verdict on one admitted request."""
    mode = mode_at(state, config, now)
    if mode is BreakerMode.OPEN:
        return state  # a straggler admitted before the trip: its verdict is already priced in
    if mode is BreakerMode.HALF_OPEN:
        if state.mode is BreakerMode.OPEN:
            state = _half_open(state)
        state = replace(state, probes_in_flight=max(state.probes_in_flight - 1, 0))
        if outcome.failed:
            return _open(now)
        if outcome is Outcome.SUCCESS:
            state = replace(state, probe_successes=state.probe_successes + 1)
            if state.probe_successes >= config.half_open_successes:
                return BreakerState()  # closed, with a fresh window
        return state
    if outcome is Outcome.ABANDONED:
        return state
    window = tuple(o for o in state.outcomes if o[0] > now - config.window_s) + ((now, outcome.failed),)
    consecutive = state.consecutive_failures + 1 if outcome.failed else 0
    failures = sum(1 for _, failed in window if failed)
    if consecutive >= config.consecutive_failures or (
        len(window) >= config.min_calls and failures / len(window) >= config.failure_ratio
    ):
        return _open(now)
    return replace(state, consecutive_failures=consecutive, outcomes=window)


class BreakerBoard:
    """One breaker per variant, with the clock injected. Not thread-safe: call it from one event loop."""

    def __init__(self, config: BreakerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.states: dict[str, BreakerState] = {}

    def admit(self, variant: str) -> bool:
        allowed, self.states[variant] = admit(self.states.get(variant, BreakerState()), self.config, self.clock())
        return allowed

    def record(self, variant: str, outcome: Outcome) -> None:
        self.states[variant] = record(self.states.get(variant, BreakerState()), self.config, self.clock(), outcome)

    def mode(self, variant: str) -> BreakerMode:
        return mode_at(self.states.get(variant, BreakerState()), self.config, self.clock())
