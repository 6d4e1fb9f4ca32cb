"""FakeBackend: replicas that exist only as records, driven by a fake clock. For unit tests and the simulator.

A started replica answers its readiness probe once `startup_s` (of the injected clock) has passed.
`crash` makes one vanish as a killed process would (with the output it left); `set_healthy(id,
False)` makes its probe fail. Both stops and crashes are reported once by `exits()`.
Every call is appended to `calls`, so tests can check what the controller asked for and in what order.

Memory, as LocalBackend (and RayBackend) model it: given node budgets (`memory_bytes` for one node
named `local`, or `nodes`), a replica whose `spec.memory_bytes` fits no node now waits STARTING
with `Replica.pending` saying why (tandem.cluster.room), is placed by a later `exits()` (once per
controller tick) when a stop or a crash has freed room, the largest waiting first, and starts its
`startup_s` from then. Without budgets memory is not counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

from tandem.cluster.backend import BackendError, PendingPlacement, Replica, ReplicaExit, ReplicaSpec, ReplicaState
from tandem.cluster.room import LOCAL_NODE, MemoryLedger, NodeBudget, NodeRoom, placing_order

__all__ = ["FakeBackend"]


class FakeBackend:
    def __init__(
        self,
        clock: Callable[[], float],
        startup_s: float | Callable[[ReplicaSpec], float] = 0.0,
        capacity: int | None = None,
        *,
        memory_bytes: int | None = None,
        nodes: Sequence[NodeBudget] | None = None,
    ) -> None:
        self.clock = clock
        self._startup = startup_s if callable(startup_s) else (lambda _spec, s=float(startup_s): s)
        self.capacity = capacity  # most replicas that may exist at once (None: unbounded)
        self._replicas: dict[str, Replica] = {}
        self._unhealthy: set[str] = set()
        self._ids = itertools.count(1)
        self.calls: list[tuple[str, str]] = []  # (operation, replica id or variant)
        self.stopped: list[Replica] = []  # everything stopped or crashed, in order
        self._exits: list[ReplicaExit] = []
        if memory_bytes is not None and nodes is not None:
            raise ValueError("give memory_bytes (one node) or nodes, not both")
        if memory_bytes is not None:
            nodes = [NodeBudget(LOCAL_NODE, memory_bytes)]
        self.memory = MemoryLedger(nodes) if nodes else None
        self._waiting: dict[str, Replica] = {}  # started, waiting for room

    # --- Backend -----------------------------------------------------------------------------
    def start(self, spec: ReplicaSpec) -> Replica:
        self.calls.append(("start", spec.variant))
        if self.capacity is not None and len(self._replicas) >= self.capacity:
            raise BackendError(f"no room for another replica (capacity {self.capacity})")
        replica_id = f"{spec.variant}-{next(self._ids)}"
        if self.memory is None:
            return self._place(replica_id, spec, "")
        self._waiting[replica_id] = Replica(replica_id, spec, ReplicaState.STARTING, started_at=self.clock())
        self._place_waiting()
        return self._replicas.get(replica_id) or self._waiting[replica_id]

    def _place(self, replica_id: str, spec: ReplicaSpec, node: str) -> Replica:
        replica = Replica(
            replica_id, spec, ReplicaState.STARTING, url=f"fake://{replica_id}", started_at=self.clock(), node=node
        )
        self._replicas[replica_id] = replica
        if self.memory is not None:
            self.memory.hold(replica_id, node, spec.memory_bytes)
        return replica

    def _place_waiting(self) -> None:
        assert self.memory is not None
        for waiting in placing_order(self._waiting.values()):
            where = self.memory.decide(waiting.spec.memory_bytes)
            if isinstance(where, PendingPlacement):
                self._waiting[waiting.replica_id] = replace(waiting, pending=where)
            else:
                del self._waiting[waiting.replica_id]
                self._place(waiting.replica_id, waiting.spec, where)

    def room(self) -> list[NodeRoom]:
        """Each node's budget and what placed replicas hold of it (none without budgets)."""
        return self.memory.rooms() if self.memory is not None else []

    def drain(self, replica_id: str) -> None:
        self.calls.append(("drain", replica_id))
        if replica_id in self._waiting:  # it holds no request: it leaves
            self._leave_waiting(replica_id)
            return
        replica = self._get(replica_id)
        self._replicas[replica_id] = replace(replica, state=ReplicaState.DRAINING)

    def stop(self, replica_id: str) -> None:
        self.calls.append(("stop", replica_id))
        if replica_id in self._waiting:
            self._leave_waiting(replica_id)
            return
        self._release(replica_id)
        replica = self._replicas.pop(replica_id, None)
        if replica is not None:  # stopping an already-gone replica is not an error (it may have crashed)
            self.stopped.append(replace(replica, state=ReplicaState.STOPPED, exit_code=0))
            self._exits.append(ReplicaExit(replace(replica, state=ReplicaState.STOPPED), 0, expected=True))
        self._unhealthy.discard(replica_id)

    def list(self) -> list[Replica]:
        return sorted((*self._replicas.values(), *self._waiting.values()), key=lambda r: (r.started_at, r.replica_id))

    def health(self, replica_id: str) -> bool:
        replica = self._replicas.get(replica_id)
        if replica is None or replica_id in self._unhealthy:
            return False
        if replica.state is ReplicaState.STARTING:
            if self.clock() - replica.started_at < self._startup(replica.spec):
                return False
            self._replicas[replica_id] = replace(replica, state=ReplicaState.READY)
        return True

    def exits(self) -> list[ReplicaExit]:
        if self._waiting:
            self._place_waiting()
        taken, self._exits = self._exits, []
        return taken

    # --- fault injection -----------------------------------------------------------------------
    def crash(self, replica_id: str, exit_code: int = -9, output: str = "") -> None:
        """The replica's process died: it is gone from `list()` without anyone stopping it."""
        replica = self._replicas.pop(replica_id)
        self._release(replica_id)
        self.stopped.append(replace(replica, state=ReplicaState.STOPPED, exit_code=exit_code))
        self._exits.append(ReplicaExit(replica, exit_code, expected=False, output=output))

    def set_healthy(self, replica_id: str, healthy: bool) -> None:
        (self._unhealthy.discard if healthy else self._unhealthy.add)(replica_id)

    def _release(self, replica_id: str) -> None:
        if self.memory is not None:
            self.memory.release(replica_id)

    def _leave_waiting(self, replica_id: str) -> None:
        gone = replace(self._waiting.pop(replica_id), state=ReplicaState.STOPPED)
        self.stopped.append(gone)
        self._exits.append(ReplicaExit(gone, None, expected=True))

    def _get(self, replica_id: str) -> Replica:
        try:
            return self._replicas[replica_id]
        except KeyError:
            raise BackendError(f"no replica {replica_id!r}") from None
