"""FakePlacer: a Placer whose actors are records a test moves by hand, beside the real RayPlacer.

`place` leaves a replica Placing; `launch` puts it on a node; `exit` ends its process; `lose` and
`lose_node` take it (or every replica on a node) away as Ray reports a dead actor or node. Every
call is appended to `calls`, so tests can check what the backend asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tandem.cluster.backend import ReplicaSpec
from tandem.cluster.ray.demand import Demand, NodeView
from tandem.cluster.ray.placer import Ended, Placement, Placing, Running, Status

__all__ = ["FakePlacer"]


@dataclass
class _Actor:
    spec: ReplicaSpec
    demand: Demand
    status: Status
    node_id: str | None = None  # the node it was pinned to


class FakePlacer:
    def __init__(self, nodes: Sequence[NodeView] = (), waiting: Sequence[Mapping[str, float]] | None = ()) -> None:
        self.node_views = list(nodes)
        self.waiting_shapes = None if waiting is None else list(waiting)
        self.actors: dict[str, _Actor] = {}
        self.calls: list[tuple[str, str]] = []
        self._pids = 1000

    # --- Placer ----------------------------------------------------------------------------------
    def place(self, replica_id: str, spec: ReplicaSpec, demand: Demand, node_id: str | None = None) -> None:
        self.calls.append(("place", replica_id))
        self.actors[replica_id] = _Actor(spec, demand, Placing(), node_id)

    def poll(self) -> Mapping[str, Status]:
        return {replica_id: actor.status for replica_id, actor in self.actors.items()}

    def terminate(self, replica_id: str) -> None:
        self.calls.append(("terminate", replica_id))

    def kill(self, replica_id: str) -> None:
        self.calls.append(("kill", replica_id))

    def release(self, replica_id: str) -> None:
        self.calls.append(("release", replica_id))
        self.actors.pop(replica_id, None)

    def nodes(self) -> Sequence[NodeView]:
        return list(self.node_views)

    def waiting(self) -> Sequence[Mapping[str, float]] | None:
        return self.waiting_shapes

    # --- what the cluster does -------------------------------------------------------------------
    def launch(self, replica_id: str, node_id: str | None = None, port: int = 9000) -> Placement:
        """Its server runs on `node_id` (default: the node it was pinned to, else node-a)."""
        node_id = node_id or self.actors[replica_id].node_id or "node-a"
        self._pids += 1
        placement = Placement(f"http://10.0.0.1:{port}", node_id, "10.0.0.1", self._pids)
        self.actors[replica_id].status = Running(placement)
        return placement

    def exit(self, replica_id: str, code: int, output: str = "") -> None:
        self.actors[replica_id].status = Ended(code, output)

    def lose(self, replica_id: str, reason: str = "ActorDiedError: the actor died unexpectedly") -> None:
        self.actors[replica_id].status = Ended(None, reason, lost=True)

    def lose_node(self, node_id: str) -> list[str]:
        """Every replica running on `node_id` is lost with it; returns their ids."""
        lost = [
            replica_id
            for replica_id, actor in self.actors.items()
            if isinstance(actor.status, Running) and actor.status.placement.node_id == node_id
        ]
        for replica_id in lost:
            self.lose(replica_id, f"ActorDiedError: the actor is dead because its node has died. Node ID: {node_id}")
        return lost
