"""The Placer: the Ray side of RayBackend, behind a Protocol so the backend's bookkeeping is tested
without a cluster (tandem.cluster.ray.fake) and runs unchanged on one (tandem.cluster.ray.runtime).

A placer holds one actor per replica, by replica id. `poll()` says where each stands: not placed
yet (`Placing`), its server process launched on a node (`Running`), or over (`Ended`: the process
exited, or the actor or its node was lost). It never blocks on the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tandem.cluster.backend import ReplicaSpec
from tandem.cluster.ray.demand import Demand, NodeView

__all__ = ["Ended", "Placement", "Placer", "Placing", "Running", "Status"]


@dataclass(frozen=True)
class Placement:
    """Where a replica's server runs: what its actor reports once the process is launched."""

    url: str  # http://NODE_IP:PORT, routable from the gateway
    node_id: str
    node_ip: str
    pid: int  # the server process, on that node
    host_pid: int = 0  # the actor's worker process, the server's parent


@dataclass(frozen=True)
class Placing:
    """The actor is not placed yet (waiting for resources, or its worker is starting)."""


@dataclass(frozen=True)
class Running:
    placement: Placement


@dataclass(frozen=True)
class Ended:
    """The replica is over: its process exited with `code`, or (`lost`) its actor or node died."""

    code: int | None
    output: str  # the end of the process's output, or what Ray said about the loss
    lost: bool = False


Status = Placing | Running | Ended


class Placer(Protocol):
    def place(self, replica_id: str, spec: ReplicaSpec, demand: Demand, node_id: str | None = None) -> None:
        """Ask for an actor with `demand`'s resources that launches the replica's server on its node
        (`node_id`: on that node only, as tandem placed it; None: where Ray chooses)."""
        ...

    def poll(self) -> Mapping[str, Status]:
        """Every replica held, by id (an Ended one stays until released)."""
        ...

    def terminate(self, replica_id: str) -> None:
        """SIGTERM the replica's server (it drains and exits; poll() then says Ended)."""
        ...

    def kill(self, replica_id: str) -> None:
        """SIGKILL the replica's server (a shutdown that outlived its grace)."""
        ...

    def release(self, replica_id: str) -> None:
        """Drop the actor (placed or not) and free its resources; the id is forgotten."""
        ...

    def nodes(self) -> Sequence[NodeView]:
        """The alive nodes: labels, total and available resources."""
        ...

    def waiting(self) -> Sequence[Mapping[str, float]] | None:
        """The resource shapes Ray could not place now (its pending demands); None where unknown."""
        ...
