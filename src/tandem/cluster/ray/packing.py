"""Which Ray node takes a replica that needs memory: tandem's first fit, in the words every backend uses. Pure.

A replica with a memory need (`spec.memory_bytes` > 0) is placed by tandem, not left to Ray's
SPREAD: among the alive nodes of its region whose CPUs and accelerators it fits beside what
tandem's replicas already take there, the first whose `memory` resource (what `ray start --memory`
or Ray's own 70% of the node's RAM says) less the memory of tandem's replicas there holds it
(tandem.cluster.room.place: the same rule and the same pending reasons as the local backend). The
nodes are tried in Ray's order, those holding the fewest replicas of the same variant first, so a
variant's replicas spread over the nodes (as Ray Serve spreads a deployment's) while other models'
replicas pack into the room left. Replicas that wait are retried largest first as room frees
(first-fit decreasing, as the simulator packs). The actor is then pinned to that node
(NodeAffinitySchedulingStrategy, hard) and still asks Ray for its resources, so Ray's accounting agrees.

A replica with no memory figure is Ray's to place, as before (tandem.cluster.ray.demand).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.cluster.backend import PendingPlacement
from tandem.cluster.ray.demand import Demand, NodeView, pending_placement
from tandem.cluster.room import NodeBudget, place

__all__ = ["Holding", "choose_node"]


@dataclass(frozen=True)
class Holding:
    """A tandem replica on a node (placed there, or pinned to it and being placed)."""

    node_id: str
    demand: Demand
    variant: str


def choose_node(
    demand: Demand, variant: str, nodes: Sequence[NodeView], held: Sequence[Holding]
) -> str | PendingPlacement:
    """The node to pin the replica to, or why it waits (module docstring)."""
    candidates = [n for n in nodes if demand.region is None or n.region == demand.region]
    if not candidates:
        return pending_placement(demand, nodes, waiting=True) or PendingPlacement("no-node-in-region", "no node")
    short = {n.node_id: n.node_id[:8] for n in nodes}  # as Ray's own messages name nodes
    if len(set(short.values())) < len(short):
        short = {n.node_id: n.node_id for n in nodes}
    full = {name: node_id for node_id, name in short.items()}
    budgets = [NodeBudget(short[n.node_id], int(n.total.get("memory", 0))) for n in candidates]
    if demand.memory_bytes > max(b.memory_bytes for b in budgets):
        return place(demand.memory_bytes, budgets, {})  # too large, in memory's words
    beyond = pending_placement(Demand(demand.cpus, 0, demand.accelerators, demand.accelerator_type, demand.region),
                               candidates, waiting=False)  # fmt: skip
    if beyond is not None:  # no node has the CPUs or accelerators at all
        return beyond
    used_memory: dict[str, int] = {}
    used_cpus: dict[str, float] = {}
    used_gpus: dict[str, float] = {}
    same: dict[str, int] = {}
    for h in held:
        used_memory[h.node_id] = used_memory.get(h.node_id, 0) + h.demand.memory_bytes
        used_cpus[h.node_id] = used_cpus.get(h.node_id, 0.0) + h.demand.cpus
        used_gpus[h.node_id] = used_gpus.get(h.node_id, 0.0) + h.demand.accelerators
        same[h.node_id] = same.get(h.node_id, 0) + (h.variant == variant)

    def fits_beside(node: NodeView) -> bool:
        cpus = node.total.get("CPU", 0.0) - used_cpus.get(node.node_id, 0.0)
        gpus = node.total.get("GPU", 0.0) - used_gpus.get(node.node_id, 0.0)
        return cpus + 1e-9 >= demand.cpus and gpus + 1e-9 >= demand.accelerators

    room = [n for n in candidates if fits_beside(n)]
    if not room:  # memory would fit, CPUs or accelerators do not: say it as Ray counts them
        return pending_placement(demand, candidates, waiting=True) or PendingPlacement("no-room", "no node has room")
    order = sorted(range(len(room)), key=lambda i: (same.get(room[i].node_id, 0), i))
    chosen = [NodeBudget(short[room[i].node_id], int(room[i].total.get("memory", 0))) for i in order]
    where = place(demand.memory_bytes, chosen, {short[k]: v for k, v in used_memory.items() if k in short})
    if isinstance(where, str):
        return full[where]
    if isinstance(where, PendingPlacement) and len(room) < len(candidates):
        # The nodes whose memory is counted are those with the CPUs for it; say so.
        return PendingPlacement(where.cause, f"{where.detail}; {len(candidates) - len(room)} more without free CPUs")
    return where
