"""The scheduling layer's Prometheus metrics (named like the server's: a `tandem:` prefix).

- `tandem:replicas{variant,state}`: replicas by state (starting, ready, draining), set every tick;
- `tandem:fallback_total{variant}`: requests re-run on the fallback variant after failing on `variant`;
- `tandem:breaker_state{variant}`: 0 closed, 1 half-open, 2 open;
- `tandem:scale_decisions_total{policy,direction}`: decisions that changed a replica count (up, down);
- `tandem:replica_restarts_total{variant}`: replicas that ended without being asked to (a crash, a
  failed start) and were replaced;
- `tandem:replicas_pending{variant,cause}`: starting replicas a backend could not place on any node
  yet (no node's memory holds it now, or ever; on Ray also no node in its region): no-room,
  too-large, no-node-in-region (tandem.cluster.room).
The gateway serves them beside its own, from the registry it passes in. Labels come from closed
sets (the deployment's variants, the replica states, the placement causes, the policies); the
gauges of a variant that left the deployment (a retired gate candidate, a rollout's old variant)
are removed once it has no replica left, not left at their last value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from tandem.cluster.backend import PendingPlacement, Replica, ReplicaState
from tandem.schedule.breaker import BreakerMode

__all__ = ["SchedulerMetrics", "set_gauges"]

PREFIX = "tandem:"
_STATES = (ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING)


def set_gauges(gauge: Gauge, values: Mapping[tuple[str, ...], float], written: set[tuple[str, ...]]) -> None:
    """Set `gauge` to exactly `values`: label sets written before (`written`, updated) and absent now are removed."""
    for labels, number in values.items():
        gauge.labels(*labels).set(number)
    for labels in written - set(values):
        try:
            gauge.remove(*labels)
        except KeyError:
            pass
    written.clear()
    written.update(values)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.replicas = Gauge(
            PREFIX + "replicas", "Replicas by variant and state.", ("variant", "state"), registry=self.registry
        )
        self.fallbacks = Counter(
            PREFIX + "fallback",  # exposed as tandem:fallback_total
            "Requests re-run on the fallback variant after failing on `variant`.",
            ("variant",),
            registry=self.registry,
        )
        self.breaker = Gauge(
            PREFIX + "breaker_state",
            "Circuit breaker per variant: 0 closed, 1 half-open, 2 open.",
            ("variant",),
            registry=self.registry,
        )
        self.scale_decisions = Counter(
            PREFIX + "scale_decisions",  # exposed as tandem:scale_decisions_total
            "Autoscaling decisions that changed a replica count.",
            ("policy", "direction"),
            registry=self.registry,
        )

        self.restarts = Counter(
            PREFIX + "replica_restarts",  # exposed as tandem:replica_restarts_total
            "Replicas that ended without being asked to (crashed or failed to start) and were replaced.",
            ("variant",),
            registry=self.registry,
        )
        self.pending = Gauge(
            PREFIX + "replicas_pending",
            "Starting replicas not placed on any node yet, by why (no-room, too-large, no-node-in-region).",
            ("variant", "cause"),
            registry=self.registry,
        )
        self._written: dict[str, set[tuple[str, ...]]] = {"replicas": set(), "pending": set(), "breaker": set()}

    def observe_replicas(self, variants: Iterable[str], replicas: Iterable[Replica]) -> None:
        replicas = list(replicas)
        counts = {(v, s): 0 for v in variants for s in _STATES}
        pending = {(v, c): 0 for v, _ in counts for c in PendingPlacement.CAUSES}
        for replica in replicas:
            if replica.state in _STATES:
                counts[(replica.variant, replica.state)] = counts.get((replica.variant, replica.state), 0) + 1
            if replica.pending is not None:
                key = (replica.variant, replica.pending.cause)
                pending[key] = pending.get(key, 0) + 1
        set_gauges(self.replicas, {(v, s.value): n for (v, s), n in counts.items()}, self._written["replicas"])
        set_gauges(self.pending, pending, self._written["pending"])

    def observe_breaker(self, variant: str, mode: BreakerMode) -> None:
        self.breaker.labels(variant).set(mode.gauge)
        self._written["breaker"].add((variant,))

    def observe_breakers(self, modes: Mapping[str, BreakerMode]) -> None:
        """Every variant's breaker now; a variant not among them (it left the deployment) loses its series."""
        set_gauges(self.breaker, {(v,): mode.gauge for v, mode in modes.items()}, self._written["breaker"])

    def count_fallback(self, variant: str) -> None:
        self.fallbacks.labels(variant).inc()

    def count_decision(self, policy: str, direction: str) -> None:
        self.scale_decisions.labels(policy, direction).inc()

    def count_restart(self, variant: str) -> None:
        self.restarts.labels(variant).inc()
