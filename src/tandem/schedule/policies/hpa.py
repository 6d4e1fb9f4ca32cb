"""`hpa`: the Kubernetes Horizontal Pod Autoscaler's algorithm, as a pure function.

Documented behaviour (kubernetes.io, "Horizontal Pod Autoscaling", algorithm details; KEP-853):
- desired = ceil(current x currentMetric / targetMetric), the metric averaged over ready replicas;
- tolerance 0.1: when |ratio - 1| <= 0.1, no scaling (the recommendation is the current count);
- replicas not ready yet count as using 0 of the metric on a scale-up; if that recomputed ratio
  is within tolerance or reverses the direction, no scaling;
- stabilization: each tick's raw recommendation is remembered; a scale-down goes only as low as
  the *highest* recommendation of the last 300 s (scale-up window 0 s: immediate);
- default rate policies: scale up by at most max(100%, 4 pods) per 15 s; scale down unlimited.
Here the metric is a replica's in-flight requests (running + waiting) or its KV-cache use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from tandem.schedule.policies.context import PolicyState, ScaleContext, ScaleLimits, apply_limits

__all__ = ["HpaParams", "hpa", "hpa_limits", "stabilize"]


@dataclass(frozen=True)
class HpaParams:
    metric: Literal["concurrency", "kv_used"] = "concurrency"
    target: float = 8.0  # per ready replica: in-flight requests, or a KV fraction in (0, 1]
    tolerance: float = 0.1  # --horizontal-pod-autoscaler-tolerance
    scale_down_stabilization_s: float = 300.0  # behavior.scaleDown.stabilizationWindowSeconds
    scale_up_stabilization_s: float = 0.0  # behavior.scaleUp.stabilizationWindowSeconds

    def __post_init__(self) -> None:
        if self.target <= 0:
            raise ValueError(f"hpa target must be > 0 (got {self.target})")
        if self.metric == "kv_used" and self.target > 1:
            raise ValueError(f"hpa kv_used target is a fraction in (0, 1] (got {self.target})")


def hpa_limits(min_replicas: int = 1, max_replicas: int = 10) -> ScaleLimits:
    """Kubernetes' default behavior: up by max(100%, 4 pods) per 15 s; down by up to 100% at once."""
    return ScaleLimits(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        max_scale_up_rate=2.0,
        max_scale_down_rate=1e9,
        scale_up_step=4,
        scale_up_cooldown_s=15.0,
    )


def _usage(ctx: ScaleContext, metric: str) -> float:
    if metric == "kv_used":
        return sum(load.kv_used for load in ctx.loads)
    return float(ctx.in_flight)  # requests buffered at the gateway load the ready replicas too


def _within(ratio: float, tolerance: float) -> bool:
    return abs(ratio - 1.0) <= tolerance + 1e-9  # inclusive: 110/100 is a ratio of 1.1, not 1.1000000000000001


def raw_recommendation(ctx: ScaleContext, params: HpaParams) -> int:
    """The replica count the metric asks for, before stabilization and limits."""
    ready = len(ctx.loads)
    if ready == 0:
        return ctx.current_replicas  # no metrics: the HPA does not act
    total = _usage(ctx, params.metric)
    ratio = total / (ready * params.target)
    if _within(ratio, params.tolerance):
        return ctx.current_replicas
    unready = max(ctx.current_replicas - ready, 0)
    if ratio > 1.0 and unready:
        # Not-yet-ready replicas are assumed to use nothing, which damps a scale-up already under way.
        ratio = total / ((ready + unready) * params.target)
        if ratio <= 1.0 or _within(ratio, params.tolerance):
            return ctx.current_replicas
        return math.ceil(ratio * (ready + unready))
    return math.ceil(ratio * ready)


def stabilize(
    recommendation: int, current: int, history: tuple[tuple[float, int], ...], now: float, up_s: float, down_s: float
) -> int:
    """Kubernetes' stabilizeRecommendationWithBehaviors: the safest value over each direction's window."""
    up = down = recommendation
    for at, value in history:
        if at > now - up_s:
            up = min(up, value)
        if at > now - down_s:
            down = max(down, value)
    result = current
    if result < up:
        result = up
    if result > down:
        result = down
    return result


def hpa(ctx: ScaleContext, params: HpaParams = HpaParams()) -> tuple[int, PolicyState]:
    raw = raw_recommendation(ctx, params)
    keep_s = max(params.scale_up_stabilization_s, params.scale_down_stabilization_s)
    history = tuple((t, r) for t, r in ctx.state.recommendations if t > ctx.now - keep_s)
    stable = stabilize(
        raw, ctx.current_replicas, history, ctx.now, params.scale_up_stabilization_s, params.scale_down_stabilization_s
    )
    state = replace(ctx.state, recommendations=(*history, (ctx.now, raw)), notes=(("raw", raw), ("stable", stable)))
    return apply_limits(stable, ctx, state)
