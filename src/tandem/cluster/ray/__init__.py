"""Replicas on a Ray cluster: `RayBackend` behind the Backend interface (`tandem serve --backend ray`).

Needs the optional extra `tandem[ray]`; only `tandem.cluster.ray.runtime` imports `ray`, and only
when a RayPlacer is built or `connect` is called, so importing this package costs nothing.

- backend: RayBackend, the bookkeeping (states, probes, drains, exits, pending reasons)
- placer: the Placer protocol it drives (place, poll, terminate, kill, release, nodes, waiting)
- runtime: RayPlacer (actors on a real cluster) and `connect` (join or start one, as ray.init does)
- host: ReplicaHost, the actor that starts `tandem serve` on its node
- demand: what a replica asks of a node, and why it is pending
- fake: FakePlacer, for tests without a cluster
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from tandem.cluster.ray.backend import RayBackend
from tandem.cluster.ray.demand import REGION_LABEL, Demand, NodeView, demand_for, pending_placement
from tandem.cluster.ray.fake import FakePlacer
from tandem.cluster.ray.placer import Ended, Placement, Placer, Placing, Running

__all__ = [
    "REGION_LABEL",
    "Demand",
    "Ended",
    "FakePlacer",
    "NodeView",
    "Placement",
    "Placer",
    "Placing",
    "RayBackend",
    "Running",
    "demand_for",
    "pending_placement",
    "ray_backend",
]


def ray_backend(
    address: str | None = None,
    *,
    log_dir: str | None = None,
    ports: tuple[int, int] | None = None,
    unset_env: Collection[str] = (),
    extra_env: Mapping[str, str] | None = None,
    kill_after_s: float = 40.0,
) -> RayBackend:
    """Join (or start) a Ray cluster and return a RayBackend on it; its `description` says which.

    `unset_env`: variables a node's replica must not inherit; `extra_env`: ones it gets (the fleet secret)."""
    from tandem.cluster.ray.runtime import RayPlacer, connect, describe_cluster

    how = connect(address)
    placer = RayPlacer(log_dir=log_dir, ports=ports, unset_env=unset_env, extra_env=extra_env)
    description = f"{how}; {describe_cluster(placer.nodes())}"
    return RayBackend(placer, kill_after_s=kill_after_s, description=description)
