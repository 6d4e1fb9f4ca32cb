"""RayBackend: the Backend interface over a Ray cluster. Each replica is a Ray actor that runs
`tandem serve` on the node Ray placed it on; the gateway reaches it over HTTP as it reaches a
local replica.

The bookkeeping is LocalBackend's (ids, states, the readiness probe, drains, SIGTERM then SIGKILL
after `kill_after_s`, each end reported once by `exits()`); placing, launching and losing
replicas is the Placer's (tandem.cluster.ray.runtime on Ray, tandem.cluster.ray.fake in tests).

- A replica with a memory need is placed by tandem's first fit over the nodes' memory
  (tandem.cluster.ray.packing: the local backend's rule and words) and pinned to that node; one
  that fits no node now waits, unasked, and is retried largest first every `exits()` as room frees.
  A replica without one is Ray's to place (SPREAD).
- A replica not placed stays STARTING with `Replica.pending` saying why (no node in its region,
  none large enough, none with room now), refreshed every `exits()` (once per controller tick) and
  logged when it changes. Nothing here waits for Ray: the gateway is never blocked.
- A replica whose actor or node is lost is reported by `exits()` as an unexpected end, like a
  local process that died, with Ray's reason; the controller replaces it (on another node, if its
  own is gone) and the gateway re-runs the requests it had not started streaming.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from tandem.cluster.backend import BackendError, PendingPlacement, Replica, ReplicaExit, ReplicaSpec, ReplicaState
from tandem.cluster.local import http_ready_probe, probe_ready
from tandem.cluster.ray.demand import Demand, NodeView, demand_for, describe_resources, pending_placement, waits
from tandem.cluster.ray.packing import Holding, choose_node
from tandem.cluster.ray.placer import Ended, Placement, Placer, Placing, Running
from tandem.cluster.room import NodeRoom, placing_order

__all__ = ["RayBackend"]

logger = logging.getLogger("tandem.cluster")


@dataclass
class _Held:
    replica: Replica
    demand: Demand
    placement: Placement | None = None
    kill_at: float | None = None  # set once SIGTERM was sent
    asked: bool = True  # Ray was asked for its actor (False: it waits for room, tandem's placement)
    pinned: str | None = None  # the node tandem placed it on (None: Ray's choice)

    @property
    def node_id(self) -> str | None:
        return self.pinned or (self.placement.node_id if self.placement is not None else None)


class RayBackend:
    def __init__(
        self,
        placer: Placer,
        probe: Callable[[str], bool] = http_ready_probe,
        clock: Callable[[], float] = time.monotonic,
        kill_after_s: float = 40.0,
        description: str = "",
    ) -> None:
        self.placer = placer
        self.probe = probe
        self.clock = clock
        self.kill_after_s = kill_after_s  # longer than the server's own shutdown timeout (30 s by default)
        self.description = description  # which cluster, as `connect` said (for the gateway's banner)
        self._live: dict[str, _Held] = {}
        self._stopping: dict[str, _Held] = {}
        self._exits: list[ReplicaExit] = []
        self._next = 0
        self._lock = threading.Lock()  # the gateway's event loop and the controller's thread both call in
        self._reaping = threading.Lock()  # one conversation with the placer at a time
        self.exited: deque[Replica] = deque(maxlen=200)  # replicas that ended, newest last

    # --- Backend ---------------------------------------------------------------------------------
    def start(self, spec: ReplicaSpec) -> Replica:
        demand = demand_for(spec)
        with self._lock:
            self._next += 1
            replica_id = f"{spec.variant}-{self._next}"
        replica = Replica(replica_id, spec, ReplicaState.STARTING, started_at=self.clock())
        if spec.memory_bytes > 0:  # tandem places it by memory (tandem.cluster.ray.packing)
            with self._reaping:
                with self._lock:
                    self._live[replica_id] = _Held(replica, demand, asked=False)
                self._place_by_memory(raising=replica_id)
            with self._lock:
                return self._live[replica_id].replica
        with self._reaping:
            try:
                self.placer.place(replica_id, spec, demand)
            except Exception as exc:  # Ray refused the request itself (bad options, a lost connection)
                raise BackendError(f"cannot start replica {replica_id} on Ray: {exc}") from exc
        with self._lock:
            self._live[replica_id] = _Held(replica, demand)
        logger.info("asked Ray for replica %s of %s (%s)", replica_id, spec.variant, _describe(demand))
        return replica

    def drain(self, replica_id: str) -> None:
        with self._lock:
            held = self._get(replica_id)
            held.replica = replace(held.replica, state=ReplicaState.DRAINING)

    def stop(self, replica_id: str) -> None:
        with self._lock:
            held = self._live.pop(replica_id, None)
            if held is None:
                return  # already gone (it may have ended on its own)
            held.replica = replace(held.replica, state=ReplicaState.STOPPED)
            placed = held.placement is not None  # (one waiting for room was never asked for)
            if placed:
                held.kill_at = self.clock() + self.kill_after_s
                self._stopping[replica_id] = held
            else:  # never placed: nothing runs; drop the request for it
                self._ended(held, ReplicaExit(held.replica, None, expected=True))
        with self._reaping:
            if placed:
                self.placer.terminate(replica_id)
            else:
                self.placer.release(replica_id)
        logger.info("stopping replica %s%s", replica_id, " (SIGTERM)" if placed else " (never placed)")

    def list(self) -> list[Replica]:
        with self._lock:
            return [h.replica for h in sorted(self._live.values(), key=lambda h: h.replica.started_at)]

    def health(self, replica_id: str) -> bool:
        with self._lock:
            held = self._live.get(replica_id)
        if held is None or held.placement is None:
            return False
        ready = probe_ready(self.probe, held.placement.url, held.replica.spec)
        with self._lock:
            if ready and held.replica.state is ReplicaState.STARTING and replica_id in self._live:
                held.replica = replace(held.replica, state=ReplicaState.READY)
        return ready

    def exits(self) -> list[ReplicaExit]:
        self.refresh()
        with self._lock:
            taken, self._exits = self._exits, []
        return taken

    # --- beyond the interface --------------------------------------------------------------------
    def refresh(self) -> None:
        """Ask the placer where every replica stands: placed (address known), still pending (why), ended."""
        with self._reaping:
            statuses = self.placer.poll()
            now = self.clock()
            nodes: list[NodeView] | None = None
            waiting = None
            with self._lock:
                held_now = [(h, h.replica.replica_id in self._stopping) for h in self._all()]
            for held, stopping in held_now:
                replica_id = held.replica.replica_id
                if not held.asked:
                    continue  # waiting for room: placed below, if it fits now
                status = statuses.get(replica_id, Ended(None, "the placer lost track of it", lost=True))
                if isinstance(status, Ended):
                    self._finish(held, status)
                elif isinstance(status, Running) and held.placement is None:
                    self._placed(held, status.placement)
                elif isinstance(status, Placing) and not stopping:
                    if nodes is None:
                        nodes, waiting = list(self.placer.nodes()), self.placer.waiting()
                    self._still_pending(held, nodes, waiting, now)
                if stopping and held.kill_at is not None and now >= held.kill_at:
                    logger.warning("replica %s outlived its shutdown grace; SIGKILL", replica_id)
                    self.placer.kill(replica_id)
                    held.kill_at = None  # once
            if any(not h.asked for h, _ in held_now):
                self._place_by_memory()

    def placement(self, replica_id: str) -> Placement | None:
        """Where a live replica runs (its node and server pid), once placed."""
        with self._lock:
            held = self._live.get(replica_id) or self._stopping.get(replica_id)
            return held.placement if held is not None else None

    def room(self) -> list[NodeRoom]:
        """Each alive node's memory (Ray's `memory` resource) and what tandem's replicas hold of it."""
        with self._reaping:
            nodes = list(self.placer.nodes())
        used: dict[str, int] = {}
        with self._lock:
            for held in self._all():
                if held.node_id:
                    used[held.node_id] = used.get(held.node_id, 0) + held.demand.memory_bytes
        return [NodeRoom(n.node_id, int(n.total.get("memory", 0)), used.get(n.node_id, 0)) for n in nodes]

    def close(self) -> None:
        """Stop every replica (SIGTERM now; `exits()` later SIGKILLs any that outlive kill_after_s)."""
        for replica in self.list():
            self.stop(replica.replica_id)

    @property
    def stopping(self) -> list[str]:
        """Replicas sent SIGTERM whose servers have not exited yet."""
        self.refresh()
        with self._lock:
            return sorted(self._stopping)

    # --- inside ----------------------------------------------------------------------------------
    def _all(self) -> list[_Held]:
        return [*self._live.values(), *self._stopping.values()]

    def _place_by_memory(self, raising: str | None = None) -> None:
        """Ask Ray for the waiting replicas that fit a node now, largest first, each pinned to its node
        (the reaping lock is held). A placer that refuses one ends it as a failed start, or raises
        BackendError for `raising` (a start still under way)."""
        nodes = list(self.placer.nodes())
        with self._lock:
            waiting = {h.replica.replica_id: h for h in self._live.values() if not h.asked}
        for replica in placing_order(h.replica for h in waiting.values()):
            held = waiting[replica.replica_id]
            with self._lock:
                holdings = [Holding(h.node_id, h.demand, h.replica.variant) for h in self._all() if h.node_id]
            where = choose_node(held.demand, replica.variant, nodes, holdings)
            if not isinstance(where, str):
                with self._lock:
                    before = held.replica.pending
                    held.replica = replace(held.replica, pending=where)
                if before is None or before.cause != where.cause:
                    logger.warning("replica %s cannot be placed yet: %s", replica.replica_id, where.reason)
                continue
            try:
                self.placer.place(replica.replica_id, replica.spec, held.demand, node_id=where)
            except Exception as exc:  # Ray refused the request itself (bad options, a lost connection)
                error = f"cannot start replica {replica.replica_id} on Ray: {exc}"
                with self._lock:
                    self._live.pop(replica.replica_id, None)
                    if replica.replica_id != raising:
                        self._ended(held, ReplicaExit(held.replica, None, expected=False, output=error))
                if replica.replica_id == raising:
                    raise BackendError(error) from exc
                logger.warning("%s", error)
                continue
            with self._lock:
                held.asked, held.pinned = True, where
                held.replica = replace(held.replica, pending=None)
            logger.info(
                "asked Ray for replica %s of %s on node %s (%s)",
                replica.replica_id, replica.variant, where[:8], _describe(held.demand),
            )  # fmt: skip

    def _placed(self, held: _Held, placement: Placement) -> None:
        with self._lock:
            held.placement = placement
            held.replica = replace(held.replica, url=placement.url, node=placement.node_id, pending=None)
        logger.info(
            "replica %s placed on node %s: %s (pid %d)",
            held.replica.replica_id, placement.node_id[:8], placement.url, placement.pid,
        )  # fmt: skip

    def _still_pending(self, held: _Held, nodes: list[NodeView], waiting, now: float) -> None:
        shapes_known = waiting is not None
        # Without Ray's list of pending demands, a replica unplaced for a while is taken to be waiting.
        waits_now = waits(held.demand, waiting) if shapes_known else now - held.replica.started_at > 10.0
        pending: PendingPlacement | None = pending_placement(held.demand, nodes, waits_now)
        with self._lock:
            before = held.replica.pending
            held.replica = replace(held.replica, pending=pending)
        if pending is not None and (before is None or before.cause != pending.cause):  # not each tick's free room
            logger.warning("replica %s cannot be placed yet: %s", held.replica.replica_id, pending)

    def _finish(self, held: _Held, status: Ended) -> None:
        replica_id = held.replica.replica_id
        self.placer.release(replica_id)
        with self._lock:
            expected = replica_id in self._stopping
            if self._live.pop(replica_id, None) is None and self._stopping.pop(replica_id, None) is None:
                return
            self._ended(held, ReplicaExit(held.replica, status.code, expected=expected, output=status.output))
        if not expected or status.code not in (0, -signal.SIGTERM, None):  # SIGTERM before its handler: as asked
            how = "was lost" if status.lost else ("exited unexpectedly" if not expected else "exited")
            tail = "\n".join(status.output.splitlines()[-20:])
            logger.warning(
                "replica %s %s (code %s) while %s; %s:\n%s",
                replica_id, how, status.code, held.replica.state.value,
                "Ray says" if status.lost else "the end of its output", tail or "(none kept)",
            )  # fmt: skip

    def _ended(self, held: _Held, ended: ReplicaExit) -> None:
        """Record an end (the lock is held)."""
        self._exits.append(ended)
        self.exited.append(replace(held.replica, state=ReplicaState.STOPPED, exit_code=ended.code))

    def _get(self, replica_id: str) -> _Held:
        try:
            return self._live[replica_id]
        except KeyError:
            raise BackendError(f"no replica {replica_id!r}") from None


def _describe(demand: Demand) -> str:
    where = f", region {demand.region}" if demand.region else ""
    return describe_resources(demand.resources()) + where
