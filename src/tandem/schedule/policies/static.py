"""`static-peak`: the baseline every operator knows. A fixed count, held all day.

The count is decided offline (the fewest replicas that meet the SLO at the trace's peak minute:
`tandem.sim.sizing.static_peak_replicas`), so the policy itself only holds it; min/max limits
still apply, so a fleet below the count is brought up to it at the next tick.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tandem.schedule.policies.context import PolicyState, ScaleContext, apply_limits

__all__ = ["StaticParams", "static_peak"]


@dataclass(frozen=True)
class StaticParams:
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"static-peak needs replicas >= 0 (got {self.replicas})")


def static_peak(ctx: ScaleContext, params: StaticParams = StaticParams()) -> tuple[int, PolicyState]:
    state = replace(ctx.state, notes=(("replicas", float(params.replicas)),))
    return apply_limits(params.replicas, ctx, state)
