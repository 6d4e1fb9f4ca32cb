"""`kpa`: the Knative Pod Autoscaler's algorithm, as a pure function.

Documented behaviour (knative.dev, "About autoscaling" / "Configuring scale to zero"; the decider in
knative/serving pkg/autoscaler/scaling/autoscaler.go):
- target per replica = container-concurrency-target (100) x target utilization (70%);
- desired = ceil(average concurrency / target) over a 60 s stable window; a panic window of 10%
  of it (6 s) is watched too;
- both counts are kept within [floor(ready / max-scale-down-rate 2), ceil(max-scale-up-rate 1000 x ready)],
  with ready counted as at least 1;
- panic mode starts when the panic-window count / ready replicas >= the panic threshold (200%); while
  panicking the larger of both counts is used and the count never decreases; panic ends once the
  threshold was not crossed for a whole stable window;
- scale to zero: once the stable count is zero, the last replica stays for the scale-to-zero grace
  period (30 s) before going; meanwhile, and while at zero, requests are buffered (Knative's
  activator: here the gateway) and a buffered request scales 0 -> 1 at once.
Concurrency here is a replica's running + waiting requests, plus what the gateway buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tandem.schedule.policies.context import PolicyState, ScaleContext, ScaleLimits, apply_limits, trim_window

__all__ = ["KpaParams", "kpa", "kpa_limits"]


@dataclass(frozen=True)
class KpaParams:
    target_concurrency: float = 100.0  # container-concurrency-target-default
    target_utilization: float = 0.7  # container-concurrency-target-percentage
    stable_window_s: float = 60.0  # stable-window
    panic_window_pct: float = 10.0  # panic-window-percentage
    panic_threshold_pct: float = 200.0  # panic-threshold-percentage
    scale_to_zero_grace_s: float = 30.0  # scale-to-zero-grace-period
    activation_scale: int = 1  # the count a revision scales to from zero

    def __post_init__(self) -> None:
        if self.target_concurrency <= 0 or not 0 < self.target_utilization <= 1:
            raise ValueError("kpa needs target_concurrency > 0 and target_utilization in (0, 1]")
        if self.stable_window_s <= 0 or not 0 < self.panic_window_pct <= 100 or self.panic_threshold_pct <= 100:
            raise ValueError("kpa needs stable_window_s > 0, panic_window_pct in (0, 100], panic_threshold_pct > 100")

    @property
    def target(self) -> float:
        return self.target_concurrency * self.target_utilization

    @property
    def panic_window_s(self) -> float:
        return self.stable_window_s * self.panic_window_pct / 100.0


def kpa_limits(min_replicas: int = 0, max_replicas: int = 10) -> ScaleLimits:
    """Knative's defaults: max-scale-up-rate 1000, max-scale-down-rate 2, scale to zero allowed."""
    return ScaleLimits(
        min_replicas=min_replicas, max_replicas=max_replicas, max_scale_up_rate=1000.0, max_scale_down_rate=2.0
    )


def _average(samples: tuple[tuple[float, float], ...], now: float, window_s: float) -> float:
    values = [v for t, v in samples if t > now - window_s]
    return sum(values) / len(values) if values else 0.0


def kpa(ctx: ScaleContext, params: KpaParams = KpaParams()) -> tuple[int, PolicyState]:
    now, limits = ctx.now, ctx.limits
    samples = (*trim_window(ctx.state.samples, now, params.stable_window_s), (now, float(ctx.in_flight)))
    stable = _average(samples, now, params.stable_window_s)
    panic = _average(samples, now, params.panic_window_s)

    ready = max(1, ctx.ready_replicas)
    max_up = math.ceil(limits.max_scale_up_rate * ready)
    max_down = math.floor(ready / limits.max_scale_down_rate) if ctx.ready_replicas else 0
    dspc = math.ceil(stable / params.target)
    dppc = math.ceil(panic / params.target)
    desired_stable = min(max(dspc, max_down), max_up)
    desired_panic = min(max(dppc, max_down), max_up)
    if params.activation_scale > 1:
        if dspc > 0:
            desired_stable = max(desired_stable, params.activation_scale)
        if dppc > 0:
            desired_panic = max(desired_panic, params.activation_scale)

    panic_since, max_panic = ctx.state.panic_since, ctx.state.max_panic_replicas
    over_threshold = dppc / ready >= params.panic_threshold_pct / 100.0
    if over_threshold:
        panic_since = now  # enter panic, or extend it
    elif panic_since is not None and panic_since + params.stable_window_s < now:
        panic_since, max_panic = None, 0  # the surge has made its way into the stable window

    desired = desired_stable
    if panic_since is not None:
        desired = max(desired, desired_panic)
        max_panic = max(max_panic, desired)
        desired = max_panic  # no scale-down while panicking

    zero_since = ctx.state.zero_since
    if desired == 0 and limits.min_replicas == 0:
        zero_since = now if zero_since is None else zero_since
        if now - zero_since < params.scale_to_zero_grace_s:
            desired = min(ctx.current_replicas, 1)  # the last replica waits out the grace period
    else:
        zero_since = None

    state = replace(
        ctx.state,
        samples=samples,
        panic_since=panic_since,
        max_panic_replicas=max_panic,
        zero_since=zero_since,
        notes=(("stable", stable), ("panic", panic), ("panicking", float(panic_since is not None))),
    )
    return apply_limits(desired, ctx, state, rate_base=ctx.ready_replicas)
