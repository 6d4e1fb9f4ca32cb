"""Placement: which region gets a new replica, and which replicas go first on a scale-down. Pure.

Adding: the variant's region with the fewest live replicas (ties: the order the deployment lists
regions), so a variant spreads over its regions. Removing: replicas still starting go first
(newest first: they hold no requests and the least sunk cost), then ready ones from the region with
the most replicas, the least busy first, so the fleet stays spread and drains fast.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from tandem.cluster.backend import Replica, ReplicaState
from tandem.contracts import ReplicaLoad

__all__ = ["region_to_add", "pick_victims"]


def region_to_add(regions: Sequence[str], live: Sequence[Replica]) -> str:
    if not regions:
        raise ValueError("a variant needs at least one region")
    counts = Counter(r.region for r in live)
    return min(regions, key=lambda region: (counts[region], regions.index(region)))


def pick_victims(live: Sequence[Replica], loads: Mapping[str, ReplicaLoad], count: int) -> list[Replica]:
    starting = sorted((r for r in live if r.state is ReplicaState.STARTING), key=lambda r: -r.started_at)
    victims = starting[:count]
    ready = [r for r in live if r.state is ReplicaState.READY]
    per_region = Counter(r.region for r in ready)

    def busy(r: Replica) -> int:
        load = loads.get(r.replica_id)
        return load.running + load.waiting if load is not None else 0

    while len(victims) < count and ready:
        victim = min(ready, key=lambda r: (-per_region[r.region], busy(r), -r.started_at, r.replica_id))
        ready.remove(victim)
        per_region[victim.region] -= 1
        victims.append(victim)
    return victims
