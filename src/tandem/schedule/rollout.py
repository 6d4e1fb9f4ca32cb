"""Rollout: move a variant's traffic to a new variant (a new optimizer) without failing a request.

A pure state machine, stepped once per controller tick: `step(rollout, fleet, now)` returns the
next state and the actions for the controller to carry out.

1. STARTING: start as many new replicas as the old variant has (at least `min_replicas`), and
   replace any that die; old replicas keep serving everything.
2. SHIFTING: once all are ready, move the share of traffic to the new variant by `shift_step`
   per tick (1.0: at once).
3. DRAINING: drain every old replica (no new requests; in-flight ones finish) and let the
   controller stop each when it is idle.
4. DONE once no old replica is left. If the new replicas are not all ready within `timeout_s`, or
   (`abort`) the new variant's replicas keep failing to start, the rollout is ABORTED: the new ones
   are drained, the old variant keeps all the traffic, and `reason` says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

__all__ = ["DrainVariant", "Fleet", "Phase", "Rollout", "StartReplicas", "abort", "step", "weights"]


class Phase(StrEnum):
    STARTING = "starting"
    SHIFTING = "shifting"
    DRAINING = "draining"
    DONE = "done"
    ABORTED = "aborted"


@dataclass(frozen=True)
class Rollout:
    old: str
    new: str
    target: int  # replicas of the new variant before any traffic moves
    started_at: float
    phase: Phase = Phase.STARTING
    weight: float = 0.0  # the new variant's share of traffic
    shift_step: float = 1.0
    timeout_s: float = 600.0
    reason: str = ""  # why it was aborted

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.DONE, Phase.ABORTED)


@dataclass(frozen=True)
class Fleet:
    """Replica counts by variant, as the controller sees them this tick."""

    live: Mapping[str, int] = field(default_factory=dict)  # starting + ready
    ready: Mapping[str, int] = field(default_factory=dict)
    draining: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StartReplicas:
    variant: str
    count: int


@dataclass(frozen=True)
class DrainVariant:
    variant: str  # drain every live replica of it


Action = StartReplicas | DrainVariant


def abort(rollout: Rollout, reason: str) -> tuple[Rollout, tuple[Action, ...]]:
    """Give up: the old variant keeps (or gets back) all the traffic, the new one is drained."""
    return replace(rollout, phase=Phase.ABORTED, weight=0.0, reason=reason), (DrainVariant(rollout.new),)


def step(rollout: Rollout, fleet: Fleet, now: float) -> tuple[Rollout, tuple[Action, ...]]:
    def live(variant: str) -> int:
        return fleet.live.get(variant, 0)

    if rollout.phase is Phase.STARTING:
        if fleet.ready.get(rollout.new, 0) >= rollout.target:
            rollout = replace(rollout, phase=Phase.SHIFTING)
        elif now - rollout.started_at > rollout.timeout_s:
            return abort(rollout, f"the new replicas were not ready within {rollout.timeout_s:g} s")
        else:
            missing = rollout.target - live(rollout.new)
            return rollout, ((StartReplicas(rollout.new, missing),) if missing > 0 else ())
    if rollout.phase is Phase.SHIFTING:
        weight = min(1.0, rollout.weight + rollout.shift_step)
        rollout = replace(rollout, weight=weight, phase=Phase.DRAINING if weight >= 1.0 else Phase.SHIFTING)
        if rollout.phase is Phase.SHIFTING:
            return rollout, ()
    if rollout.phase is Phase.DRAINING:
        if live(rollout.old) + fleet.draining.get(rollout.old, 0) == 0:
            return replace(rollout, phase=Phase.DONE), ()
        return rollout, ((DrainVariant(rollout.old),) if live(rollout.old) else ())
    return rollout, ()


def weights(rollout: Rollout) -> dict[str, float]:
    """The share of the primary traffic each variant gets now."""
    if rollout.phase is Phase.ABORTED:
        return {rollout.old: 1.0}
    if rollout.phase is Phase.DONE:
        return {rollout.new: 1.0}
    return {rollout.old: 1.0 - rollout.weight, rollout.new: rollout.weight}
