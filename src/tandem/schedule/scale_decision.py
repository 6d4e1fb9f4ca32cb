"""A variant's last scaling decision and what it was made on, for an operator (`GET /admin/replicas`):
why the fleet grows, shrinks, or stays as it is.

A pure function of the tick's ScaleContext and the policy's answer; the controller keeps the latest
one per variant. `outcome`: "up" and "down" are actions taken, "hold" is the policy's own verdict,
"backing off" is an increase the start history holds back (failed starts: tandem.schedule.restarts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.schedule.policies.context import ScaleContext

__all__ = ["ScaleDecision", "scale_decision"]


@dataclass(frozen=True)
class ScaleDecision:
    at: float  # the controller's clock
    policy: str
    current: int  # starting + ready replicas
    ready: int
    desired: int
    outcome: str  # up, down, hold, backing off
    in_flight: int  # running + waiting on replicas + buffered at the gateway
    buffered: int
    kv_used: float | None  # mean over the ready replicas' reports (None: no report)
    demand: dict[str, float | None]  # tokens and requests per second (TokenDemand)
    limits: dict[str, int]
    notes: dict[str, float]  # the policy's own inputs and intermediate values (PolicyState.notes)

    def view(self, now: float) -> dict[str, Any]:
        return {
            "age_s": round(now - self.at, 3), "policy": self.policy, "outcome": self.outcome,
            "current": self.current, "ready": self.ready, "desired": self.desired, "in_flight": self.in_flight,
            "buffered": self.buffered, "kv_used": self.kv_used, "demand": self.demand, "limits": self.limits,
            "notes": self.notes,
        }  # fmt: skip


def scale_decision(ctx: ScaleContext, policy: str, desired: int, notes, backing_off: bool) -> ScaleDecision:
    """What one tick decided for ctx.variant and on what."""
    if desired > ctx.current_replicas:
        outcome = "backing off" if backing_off else "up"
    elif desired < ctx.current_replicas:
        outcome = "down"
    else:
        outcome = "hold"
    kv = [load.kv_used for load in ctx.loads]
    d = ctx.demand
    return ScaleDecision(
        at=ctx.now, policy=policy, current=ctx.current_replicas, ready=ctx.ready_replicas, desired=desired,
        outcome=outcome, in_flight=ctx.in_flight, buffered=ctx.buffered,
        kv_used=round(sum(kv) / len(kv), 4) if kv else None,
        demand={
            "prompt_tokens_per_s": round(d.prompt_tokens_per_s, 3),
            "output_tokens_per_s": round(d.output_tokens_per_s, 3),
            "requests_per_s": round(d.requests_per_s, 3), "arrived_requests_per_s": d.arrived_requests_per_s,
            "slo_attainment": d.slo_attainment,
        },
        limits={"min": ctx.limits.min_replicas, "max": ctx.limits.max_replicas},
        notes={str(k): round(float(v), 4) for k, v in notes},
    )  # fmt: skip
