"""What every autoscaling policy sees and returns: frozen inputs, state in, state out, the clock as data.

A policy is a pure function `(ScaleContext) -> (desired_replicas, PolicyState)`: the same context
always gives the same answer, so the controller, the simulator and the tests run the very same code
on a real, virtual or fake clock. `ScaleLimits` (min/max, rates, cooldowns) are shared by all
policies and applied last, by `apply_limits`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tandem.contracts import Profile, ReplicaLoad

__all__ = [
    "Policy",
    "PolicyState",
    "ScaleContext",
    "ScaleLimits",
    "TokenDemand",
    "apply_limits",
    "rate_bounds",
    "trim_window",
]


@dataclass(frozen=True)
class ScaleLimits:
    """Bounds every policy obeys.

    Rates are multiplicative, as in Knative: one decision may move from `n` replicas to at most
    `ceil(max_scale_up_rate * max(n, 1))` and at least `floor(n / max_scale_down_rate)`.
    `scale_up_step` replicas may always be added, whatever the rate (Kubernetes HPA's default
    "4 pods or 100% per 15 s, whichever is more" is rate 2.0, step 4, cooldown 15 s).
    Cooldowns: no scale-up within `scale_up_cooldown_s` of the last scale-up; no scale-down within
    `scale_down_cooldown_s` of the last scale in either direction (shrinking just after growing is
    flapping).
    """

    min_replicas: int = 1
    max_replicas: int = 8
    max_scale_up_rate: float = 1000.0  # Knative's default: effectively unbounded
    max_scale_down_rate: float = 2.0  # Knative's default: at most halve per decision
    scale_up_step: int = 1
    scale_up_cooldown_s: float = 0.0
    scale_down_cooldown_s: float = 0.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0 (got {self.min_replicas})")
        if self.max_replicas < max(self.min_replicas, 1):
            raise ValueError(f"max_replicas ({self.max_replicas}) must be >= max(min_replicas, 1)")
        if self.max_scale_up_rate < 1.0 or self.max_scale_down_rate < 1.0:
            raise ValueError("max_scale_up_rate and max_scale_down_rate must be >= 1.0")
        if self.scale_up_step < 0 or self.scale_up_cooldown_s < 0 or self.scale_down_cooldown_s < 0:
            raise ValueError("scale_up_step and cooldowns must be >= 0")


@dataclass(frozen=True)
class TokenDemand:
    """Observed token traffic to one variant, per second (the gateway counts it)."""

    prompt_tokens_per_s: float = 0.0  # of the requests that finished in the window
    output_tokens_per_s: float = 0.0
    requests_per_s: float = 0.0
    arrived_requests_per_s: float | None = None  # requests that arrived in the window (None: not counted)
    arrived_prompt_tokens_per_s: float | None = None  # ... and their prompt tokens
    slo_attainment: float | None = None  # share of the window's finished requests within the SLO (None: unknown)
    arrived_requests_total: int | None = None  # requests arrived since the meter started (None: not counted)
    arrived_prompt_tokens_total: int | None = None  # ... and their prompt tokens (a policy differences them per tick)
    short_output_tokens: float | None = None  # a low quantile of recent requests' output tokens (None: not kept)


@dataclass(frozen=True)
class PolicyState:
    """Everything a policy remembers between ticks. One type for all policies; each uses its fields.

    Windows are tuples of (time, value), oldest first, trimmed by the policy that owns them.
    """

    recommendations: tuple[tuple[float, int], ...] = ()  # HPA/capacity stabilization window
    samples: tuple[tuple[float, float], ...] = ()  # KPA concurrency / capacity arriving work, per tick
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    panic_since: float | None = None  # KPA: last time the panic window was over the threshold
    max_panic_replicas: int = 0  # KPA: the ratchet while panicking (never decreases)
    zero_since: float | None = None  # KPA: when the stable recommendation first fell to zero
    level: float | None = None  # capacity: smoothed demand (Holt's linear method)
    trend: float = 0.0  # capacity: demand change per second
    updated_at: float | None = None  # capacity: time of the last smoothing update
    mix: float | None = None  # capacity: prompt tokens per output token of the traffic (smoothed)
    seq_tokens: float | None = None  # capacity: prompt + output tokens per request (smoothed)
    out_per_request: float | None = None  # capacity: output tokens per request (smoothed)
    in_flight: int | None = None  # capacity: in-flight requests at the last tick (arrivals = growth + completions)
    arrivals: float | None = None  # capacity: requests arriving per second (smoothed)
    peaks: tuple[tuple[float, float, float], ...] = ()  # capacity: (time, need / what was forecast, weight)
    forecasts: tuple[tuple[float, float], ...] = ()  # capacity: (time made, work forecast a cold start ahead)
    gain: float = 1.0  # capacity: the attainment feedback's correction of the headroom
    attained: tuple[float, float] = (0.0, 0.0)  # capacity: (requests within the SLO, requests), decayed
    arrived_totals: tuple[int, int] | None = None  # capacity: the gateway's arrival counters at the last tick
    ticks: tuple[tuple[float, float], ...] = ()  # capacity: (time, work that arrived since the tick before), per tick
    queued_since: float | None = None  # capacity: since when requests have waited at the gateway without a break
    notes: tuple[tuple[str, float], ...] = field(default=(), compare=False)  # last decision's inputs, for logs


@dataclass(frozen=True)
class ScaleContext:
    """One variant's situation at one instant, as the controller (or simulator) sees it."""

    now: float  # seconds, on whatever clock drives the loop
    variant: str
    current_replicas: int  # starting + ready (draining replicas are already on their way out)
    ready_replicas: int
    loads: tuple[ReplicaLoad, ...] = ()  # one per ready replica
    limits: ScaleLimits = ScaleLimits()
    state: PolicyState = PolicyState()
    demand: TokenDemand = TokenDemand()
    buffered: int = 0  # requests held at the gateway because no replica could take them (e.g. at zero)
    profile: Profile | None = None

    @property
    def in_flight(self) -> int:
        """Requests running or queued on replicas, plus those buffered at the gateway."""
        return sum(load.running + load.waiting for load in self.loads) + self.buffered


Policy = Callable[[ScaleContext], tuple[int, PolicyState]]


def trim_window(points: tuple[tuple[float, float], ...], now: float, window_s: float) -> tuple:
    """Keep the points newer than `now - window_s` (a point exactly at the cutoff drops out)."""
    cutoff = now - window_s
    return tuple(p for p in points if p[0] > cutoff)


def rate_bounds(base: int, limits: ScaleLimits) -> tuple[int, int]:
    """(lowest, highest) replica count one decision may reach from `base` replicas."""
    upper = max(math.ceil(limits.max_scale_up_rate * max(base, 1)), base + limits.scale_up_step)
    lower = math.floor(base / limits.max_scale_down_rate)
    return lower, upper


def apply_limits(
    desired: int, ctx: ScaleContext, state: PolicyState, rate_base: int | None = None
) -> tuple[int, PolicyState]:
    """Rates, cooldowns, then min/max; records the time of a scale in the returned state.

    `rate_base` is the count the rates are relative to (default: current replicas; KPA uses ready).
    """
    limits, current, now = ctx.limits, ctx.current_replicas, ctx.now
    lower, upper = rate_bounds(current if rate_base is None else rate_base, limits)
    target = min(max(desired, lower), upper)
    if target > current and state.last_scale_up_at is not None:
        if now - state.last_scale_up_at < limits.scale_up_cooldown_s:
            target = current
    if target < current:
        last = max((t for t in (state.last_scale_up_at, state.last_scale_down_at) if t is not None), default=None)
        if last is not None and now - last < limits.scale_down_cooldown_s:
            target = current
    target = min(max(target, limits.min_replicas), limits.max_replicas)
    if target > current:
        state = replace(state, last_scale_up_at=now)
    elif target < current:
        state = replace(state, last_scale_down_at=now)
    return target, state
