"""`capacity`: tandem's own policy. Replicas = predicted token demand / one replica's measured capacity.

- Capacity comes from the variant's Profile (measured by the optimization layer): the largest
  batch whose per-sequence decode rate still meets the latency SLO (time per output token), and
  the output tokens/s at that batch. A faster optimizer has a larger capacity, so the same
  traffic needs fewer replicas; the scheduler does not change a line.
- Demand is output tokens/s: the larger of what the gateway saw served and what the in-flight
  sequences need at the SLO pace (in-flight x 1 / tpot). Served tokens saturate at capacity, so
  without the second term a queue would never show up as demand.
- Forecast: Holt's linear smoothing (level + trend) of demand, projected over the replicas'
  cold start (the Profile's cold_start_s): what is started now serves the demand of then. The
  forecast only adds: the present demand is never undersized.
- Prompt tokens cost prefill time: a replica's busy fraction is prompt/prefill_rate + output/capacity.
- Scale-down is stabilized (the highest recommendation of the last 60 s); scale-up is immediate.
- A persistent minimum tier: the replicas needed for `min_tier_tokens_per_s` are always kept,
  however quiet it gets (so a faster optimizer shrinks the always-on tier too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tandem.contracts import Profile
from tandem.schedule.policies.context import PolicyState, ScaleContext, apply_limits
from tandem.schedule.policies.hpa import stabilize

__all__ = ["CapacityParams", "SloCapacity", "capacity", "slo_capacity", "forecast_demand"]


@dataclass(frozen=True)
class CapacityParams:
    tpot_slo_s: float = 0.1  # time per output token each sequence must keep (10 tokens/s)
    target_utilization: float = 1.0  # plan replicas busy at most this fraction of their capacity
    smoothing: float = 0.5  # Holt alpha (level)
    trend_smoothing: float = 0.3  # Holt beta (trend)
    horizon_s: float | None = None  # forecast horizon; None: the profile's cold start
    scale_down_stabilization_s: float = 60.0
    min_tier_tokens_per_s: float = 0.0  # output demand the persistent tier is sized for

    def __post_init__(self) -> None:
        if self.tpot_slo_s <= 0 or not 0 < self.target_utilization <= 1:
            raise ValueError("capacity needs tpot_slo_s > 0 and target_utilization in (0, 1]")
        if not (0 < self.smoothing <= 1 and 0 <= self.trend_smoothing <= 1):
            raise ValueError("capacity needs smoothing in (0, 1] and trend_smoothing in [0, 1]")


@dataclass(frozen=True)
class SloCapacity:
    batch: int  # concurrent sequences per replica at the SLO
    output_tokens_per_s: float  # one replica's decode throughput at that batch
    meets_slo: bool  # False: even batch 1 is slower than the SLO (the capacity is best effort)


def slo_capacity(profile: Profile, tpot_slo_s: float) -> SloCapacity:
    """The largest batch whose per-sequence rate meets the SLO, and the throughput there."""
    best: SloCapacity | None = None
    for batch in range(1, max(profile.max_slots, 1) + 1):
        rate = profile.decode_capacity(batch)
        if rate / batch >= 1.0 / tpot_slo_s and (best is None or rate >= best.output_tokens_per_s):
            best = SloCapacity(batch, rate, True)
    return best or SloCapacity(1, profile.decode_capacity(1), False)


def forecast_demand(state: PolicyState, observed: float, now: float, params: CapacityParams, horizon_s: float):
    """Holt's linear method on an irregular clock: returns (predicted demand, level, trend)."""
    if state.level is None or state.updated_at is None or now <= state.updated_at:
        level = observed if state.level is None else state.level
        trend = state.trend
    else:
        dt = now - state.updated_at
        level = params.smoothing * observed + (1 - params.smoothing) * (state.level + state.trend * dt)
        trend = params.trend_smoothing * (level - state.level) / dt + (1 - params.trend_smoothing) * state.trend
    predicted = max(observed, level + trend * horizon_s, 0.0)
    return predicted, level, trend


def capacity(ctx: ScaleContext, params: CapacityParams = CapacityParams()) -> tuple[int, PolicyState]:
    profile = ctx.profile
    if profile is None:
        raise ValueError(f"the capacity policy needs the measured Profile of variant {ctx.variant!r}")
    cap = slo_capacity(profile, params.tpot_slo_s)
    observed = max(ctx.demand.output_tokens_per_s, ctx.in_flight / params.tpot_slo_s)
    horizon = profile.cold_start_s if params.horizon_s is None else params.horizon_s
    predicted, level, trend = forecast_demand(ctx.state, observed, ctx.now, params, horizon)

    busy = predicted / cap.output_tokens_per_s if cap.output_tokens_per_s > 0 else math.inf
    if profile.prefill_tokens_per_s > 0:
        busy += ctx.demand.prompt_tokens_per_s / profile.prefill_tokens_per_s
    raw = math.ceil(busy / params.target_utilization - 1e-9) if math.isfinite(busy) else ctx.limits.max_replicas
    tier = math.ceil(params.min_tier_tokens_per_s / cap.output_tokens_per_s - 1e-9) if cap.output_tokens_per_s else 0
    raw = max(raw, tier)

    window = params.scale_down_stabilization_s
    history = tuple((t, r) for t, r in ctx.state.recommendations if t > ctx.now - window)
    stable = stabilize(raw, ctx.current_replicas, history, ctx.now, 0.0, window)
    state = replace(
        ctx.state,
        recommendations=(*history, (ctx.now, raw)),
        level=level,
        trend=trend,
        updated_at=ctx.now,
        notes=(("observed", observed), ("predicted", predicted), ("capacity", cap.output_tokens_per_s)),
    )
    desired, state = apply_limits(max(stable, tier), ctx, state)
    return desired, state
