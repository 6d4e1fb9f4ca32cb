"""Dispatcher: the per-request side of the scheduling layer, the one object the gateway calls.

    target = dispatcher.pick(RouteRequest(region=..., prefix=prompt))     # None: buffer the request
    ... proxy to target.url; on success: dispatcher.succeeded(target, prompt_tokens, output_tokens)
    ... on failure: decision = dispatcher.failed(attempts, kind, first_byte_sent)
        Retry -> dispatcher.pick(RouteRequest(..., exclude=decision.exclude), variant=decision.variant)
        ErrorEvent -> end the stream with an error event; Fail -> answer decision.status; PassThrough
    ... client went away: dispatcher.abandoned(target)

It picks the variant by the controller's traffic weights (a rollout splits traffic), diverts to
the fallback variant while the chosen variant's breaker is open, picks the replica with the router
over the replicas' loads (their own GET /load reports, refreshed by the gateway's in-flight counts),
and keeps those counts, the breakers, the demand meter and
the metrics up to date. `tandem:fallback_total{variant}` counts requests served by the fallback
instead of `variant`: re-runs after a failure and diversions by an open breaker.
Not thread-safe: call it from the gateway's event loop.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tandem.cluster.backend import Backend
from tandem.contracts import ReplicaLoad
from tandem.schedule.breaker import BreakerBoard, Outcome
from tandem.schedule.fallback import Attempt, Decision, FailureKind, FallbackPlan, Retry, after_failure, breaker_outcome
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.routers import Router, RouteRequest, eligible
from tandem.schedule.traffic import DemandMeter, InFlight

__all__ = ["Dispatcher", "Target"]


@dataclass(frozen=True)
class Target:
    variant: str
    replica_id: str
    url: str
    diverted: bool = False  # the breaker of the weighted choice was open: this is the fallback
    counted: bool = True  # its breaker admitted it, so its outcome is the breaker's business


class Dispatcher:
    def __init__(
        self,
        backend: Backend,
        router: Router,
        breakers: BreakerBoard,
        plan: FallbackPlan,
        weights: Callable[[], dict[str, float]],
        inflight: InFlight | None = None,
        demand: DemandMeter | None = None,
        metrics: SchedulerMetrics | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.router = router
        self.breakers = breakers
        self.plan = plan
        self.weights = weights  # Controller.weights
        self.inflight = inflight or InFlight(clock)
        self.demand = demand or DemandMeter()
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.clock = clock
        self.on_release: Callable[[], None] | None = None  # a request left its replica (a queue's turn)

    # --- choosing ------------------------------------------------------------------------------
    def loads(self, variant: str | None = None) -> list[ReplicaLoad]:
        """Each replica's load: its last report refreshed by this gateway's in-flight counts (InFlight)."""
        replicas = [r for r in self.backend.list() if variant is None or r.variant == variant]
        return list(self.inflight.loads(replicas).values())

    def pick(self, request: RouteRequest, variant: str | None = None) -> Target | None:
        """A replica for this request (in flight from now on), or None when no replica can take it."""
        loads = self.loads()
        if variant is not None:  # a retry: the variant is decided; its breaker only counts it if it admits it
            return self._take(request, variant, loads, counted=self.breakers.admit(variant))
        chosen = self._weighted(request, loads)
        if chosen is None:
            return None
        fallback = self.plan.fallback
        if self.breakers.admit(chosen):
            return self._take(request, chosen, loads, counted=True)
        self._observe_breaker(chosen)
        if fallback is not None and fallback != chosen and self._has_room(request, fallback, loads):
            target = self._take(request, fallback, loads, counted=self.breakers.admit(fallback))
            if target is not None:
                if self.metrics is not None:
                    self.metrics.count_fallback(chosen)
                return replace(target, diverted=True)
        return self._take(request, chosen, loads, counted=False)  # nowhere to divert: try it rather than refuse

    def _weighted(self, request: RouteRequest, loads: Sequence[ReplicaLoad]) -> str | None:
        weights = {v: w for v, w in self.weights().items() if w > 0}
        with_room = {v: w for v, w in weights.items() if self._has_room(request, v, loads)}
        if not with_room:  # e.g. a rollout's only ready variant, or nothing ready at all yet
            ranked = sorted(weights, key=lambda v: -weights[v])
            return ranked[0] if ranked and self._has_room(request, ranked[0], loads) else None
        roll, total = self.rng.random() * sum(with_room.values()), 0.0
        for variant, weight in sorted(with_room.items()):
            total += weight
            if roll < total:
                return variant
        return max(with_room, key=with_room.get)

    def _has_room(self, request: RouteRequest, variant: str, loads: Sequence[ReplicaLoad]) -> bool:
        return any(load.variant == variant for load in eligible(request, loads))

    def _take(self, request: RouteRequest, variant: str, loads: Sequence[ReplicaLoad], counted: bool):
        choice = self.router.choose(request, [load for load in loads if load.variant == variant])
        if choice is None:
            if counted:
                self.breakers.record(variant, Outcome.ABANDONED)  # release a half-open probe slot
            return None
        url = next((r.url for r in self.backend.list() if r.replica_id == choice.replica_id), "")
        self.inflight.begin(choice.replica_id)
        return Target(variant, choice.replica_id, url, counted=counted)

    def _record(self, target: Target, outcome: Outcome) -> None:
        if target.counted:
            self.breakers.record(target.variant, outcome)
        self._observe_breaker(target.variant)

    # --- outcomes ------------------------------------------------------------------------------
    def succeeded(self, target: Target, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        self._end(target)
        self._record(target, Outcome.SUCCESS)
        self.demand.record(target.variant, self.clock(), prompt_tokens, output_tokens)

    def abandoned(self, target: Target) -> None:
        self._end(target)
        self._record(target, Outcome.ABANDONED)

    def failed(
        self, attempts: Sequence[Target], kind: FailureKind, first_byte_sent: bool, resumable: bool = False
    ) -> Decision:
        """Account for the last attempt's failure and say what to do next (`resumable`: after_failure's)."""
        last = attempts[-1]
        self._end(last)
        if kind is FailureKind.UNREACHABLE:
            self.inflight.mark_unreachable(last.replica_id)  # skipped a few seconds; the controller probes it
        outcome = breaker_outcome(kind)
        self._record(last, outcome if outcome is not None else Outcome.ABANDONED)
        tried = frozenset(a.replica_id for a in attempts)
        loads = self.loads()
        left = sum(1 for load in eligible(RouteRequest(exclude=tried), loads) if load.variant == last.variant)
        fallback_ok = self.plan.fallback is not None and self._has_room(
            RouteRequest(exclude=tried), self.plan.fallback, loads
        )
        decision = after_failure(
            self.plan,
            tuple(Attempt(a.variant, a.replica_id) for a in attempts),
            kind,
            first_byte_sent,
            same_variant_left=left,
            fallback_available=fallback_ok,
            resumable=resumable,
        )
        if isinstance(decision, Retry) and decision.is_fallback and self.metrics is not None:
            self.metrics.count_fallback(last.variant)
        return decision

    def _end(self, target: Target) -> None:
        self.inflight.end(target.replica_id)
        if self.on_release is not None:
            self.on_release()

    def _observe_breaker(self, variant: str) -> None:
        if self.metrics is not None:
            self.metrics.observe_breaker(variant, self.breakers.mode(variant))
