"""What the simulated gateway shows its router: the ready replicas' loads, kept current between ticks.

The router is asked once per request routed and, while requests wait at the gateway, again at every
dispatch (`SimConfig.dispatch_substeps` a step), and a fleet in a scale-up runs to hundreds of replicas:
rebuilding every replica's `ReplicaLoad` for every dispatch was most of a simulation's time. So:

- the fleet (which replicas there are, and their health) changes only in a controller tick: `reset` after each;
- starting and draining replicas are left out: every router picks among healthy ones (`routers.eligible`), so
  they would only cost it time;
- a replica's load is read again only after something changed its queues (a step that moved its
  SimReplica's `version`: `stepped`; a submit), and only when the router is next asked (while nothing waits
  at the gateway it is not asked);
- a replica whose numbers did not change reports the same (frozen) load again (`LoadReader`).

The router sees exactly the loads a fresh reading of every ready replica would give, in the fleet's order
(tests/sim/test_router_view.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from tandem.cluster.backend import Replica, ReplicaState
from tandem.contracts import ReplicaLoad
from tandem.schedule.routers import Router
from tandem.sim.prefix_cache import route_for
from tandem.sim.replica import SimReplica, SimSequence

__all__ = ["LoadReader", "RouterView"]


class LoadReader:
    """A replica's load as the gateway reports it (its SimReplica's queues and the backend's health), read again
    only when its SimReplica's `version` or its health moved, and built anew only when a number changed."""

    def __init__(self, sim_of: Callable[[Replica], SimReplica], max_slots: int) -> None:
        self.sim_of = sim_of
        self.max_slots = max_slots
        self._last: dict[str, tuple[int, bool, ReplicaLoad]] = {}  # replica id -> (version, healthy, load)

    def __call__(self, replica: Replica) -> ReplicaLoad:
        sim = self.sim_of(replica)
        healthy = replica.state is ReplicaState.READY
        last = self._last.get(replica.replica_id)
        if last is not None and last[0] == sim.version and last[1] is healthy:
            return last[2]
        running = len(sim.prefilling) + len(sim.decoding)
        waiting, pending = len(sim.waiting), sim.prefill_pending
        load = last[2] if last is not None and last[1] is healthy else None
        if load is None or (load.running, load.waiting, load.prefill_tokens) != (running, waiting, pending):
            load = ReplicaLoad(
                replica.replica_id,
                replica.region,
                replica.variant,
                running=running,
                waiting=waiting,
                kv_used=running / self.max_slots,
                healthy=healthy,
                prefill_tokens=pending,
            )
        self._last[replica.replica_id] = (sim.version, healthy, load)
        return load

    def forget(self, replica_id: str) -> None:
        self._last.pop(replica_id, None)


class RouterView:
    def __init__(self, router: Router, read: LoadReader) -> None:
        self.router = router
        self.read = read
        self.loads: dict[str, ReplicaLoad] = {}  # the ready replicas' loads, by id, in the fleet's order
        self.ready: dict[str, tuple[Replica, SimReplica]] = {}
        self.sims: list[SimReplica] = []  # the ready replicas' SimReplicas, in that order (for route_for)
        self.stale: set[str] = set()  # stepped since their load was read

    def reset(self, fleet: Sequence[tuple[Replica, SimReplica]]) -> None:
        """The fleet after a controller tick (every replica, in the backend's order, with its SimReplica)."""
        self.ready = {r.replica_id: (r, sim) for r, sim in fleet if r.state is ReplicaState.READY}
        self.loads = {replica_id: self.read(r) for replica_id, (r, _) in self.ready.items()}
        self.sims = [sim for _, sim in self.ready.values()]
        self.stale.clear()

    def stepped(self, replica_id: str) -> None:
        """A step changed the replica's queues (its SimReplica's version moved)."""
        self.stale.add(replica_id)

    def dispatch(self, gateway: deque[SimSequence], now: float) -> None:
        """Route the gateway's requests, first to last, until the router refuses one."""
        if not gateway:
            return
        for replica_id in self.stale:
            if replica_id in self.loads:
                self.loads[replica_id] = self.read(self.ready[replica_id][0])
        self.stale.clear()
        while gateway:  # a submit leaves the replicas' prefix caches as they were: `sims` stays right for route_for
            choice = self.router.choose(route_for(gateway[0], self.sims), list(self.loads.values()))
            if choice is None:
                return
            replica, sim = self.ready[choice.replica_id]
            sim.submit(gateway.popleft(), now)
            self.loads[choice.replica_id] = self.read(replica)
