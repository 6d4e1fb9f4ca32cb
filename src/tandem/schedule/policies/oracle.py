"""`oracle`: the clairvoyant lower bound. It holds a replica schedule computed from the trace itself.

The schedule (`tandem.sim.oracle.oracle_schedule`) knows every future arrival; the policy only looks
it up: at `now` it asks for the most replicas the schedule needs over the next `lookahead_s` (the
cold start plus a tick: what is started now is ready then), so each rise is met exactly in time and
each replica goes the moment no window ahead needs it. No policy that sees only the past can hold
fewer replicas for the same SLO under the same replica model; it is the bound the others are judged
against (a ratio of replica-hours to it).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from tandem.schedule.policies.context import PolicyState, ScaleContext, apply_limits

__all__ = ["OracleParams", "oracle"]


@dataclass(frozen=True)
class OracleParams:
    starts: tuple[float, ...] = ()  # window start times, ascending
    replicas: tuple[int, ...] = ()  # replicas each window needs
    lookahead_s: float = 62.0  # cold start + one tick

    def __post_init__(self) -> None:
        if len(self.starts) != len(self.replicas) or list(self.starts) != sorted(self.starts):
            raise ValueError("oracle needs one replica count per window start, starts ascending")
        if self.lookahead_s < 0:
            raise ValueError("oracle needs lookahead_s >= 0")


def oracle(ctx: ScaleContext, params: OracleParams = OracleParams()) -> tuple[int, PolicyState]:
    if not params.starts:
        return apply_limits(ctx.limits.min_replicas, ctx, ctx.state)
    first = max(bisect.bisect_right(params.starts, ctx.now) - 1, 0)  # the window now is in
    last = bisect.bisect_right(params.starts, ctx.now + params.lookahead_s)
    desired = max(params.replicas[first : max(last, first + 1)])
    state = replace(ctx.state, notes=(("scheduled", float(desired)),))
    return apply_limits(desired, ctx, state)
