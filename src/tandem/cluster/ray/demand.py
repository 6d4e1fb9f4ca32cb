"""What a replica asks of a Ray node, and why Ray has not placed it yet. Pure functions of frozen data.

A replica's demand: its threads as CPUs, its memory (the variant's weights, KV budget and runtime;
see tandem.schedule.variant), accelerators when its variant asks, and its region as a node label
(`region=eu`: `ray start --labels region=eu`). The region `local` (the default) places it on any node.

`pending_placement` turns a demand that waits into an operator's sentence: no node carries the
region's label; no node is large enough, ever (Ray calls such a demand infeasible); or the nodes
that could hold it are full now (it waits for room, or for a node the Ray autoscaler adds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tandem.cluster.backend import PendingPlacement, ReplicaSpec

__all__ = [
    "ANY_REGION",
    "REGION_LABEL",
    "Demand",
    "NodeView",
    "demand_for",
    "describe_resources",
    "pending_placement",
    "waits",
]

REGION_LABEL = "region"  # the node label a region is (ray start --labels region=eu)
ANY_REGION = "local"  # the deployment's default region: any node will do


@dataclass(frozen=True)
class Demand:
    cpus: float
    memory_bytes: int = 0
    accelerators: float = 0.0
    accelerator_type: str | None = None
    region: str | None = None  # a node with the label region=<this>; None: any node

    def resources(self) -> dict[str, float]:
        """As Ray counts it (resource name -> amount); what Ray lists among its pending demands."""
        out = {"CPU": float(self.cpus)}
        if self.memory_bytes:
            out["memory"] = float(self.memory_bytes)
        if self.accelerators:
            out["GPU"] = float(self.accelerators)
        if self.accelerator_type:
            out[f"accelerator_type:{self.accelerator_type}"] = 0.001  # Ray's own encoding of accelerator_type
        return out


@dataclass(frozen=True)
class NodeView:
    """One alive Ray node: its labels, its resources in total, and those free now."""

    node_id: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    total: Mapping[str, float] = field(default_factory=dict)
    available: Mapping[str, float] = field(default_factory=dict)

    @property
    def region(self) -> str | None:
        return self.labels.get(REGION_LABEL)


def demand_for(spec: ReplicaSpec) -> Demand:
    return Demand(
        cpus=float(spec.threads or 1),
        memory_bytes=spec.memory_bytes,
        accelerators=spec.accelerators,
        accelerator_type=spec.accelerator_type,
        region=None if spec.region == ANY_REGION else spec.region,
    )


def _amount(name: str, value: float) -> str:
    if name == "memory":
        return f"{value / (1 << 30):.2f} GiB"
    return f"{value:g}"


def describe_resources(resources: Mapping[str, float]) -> str:
    """{'CPU': 1, 'memory': 2**30} -> 'CPU 1, memory 1.00 GiB'."""
    return ", ".join(f"{name} {_amount(name, value)}" for name, value in resources.items()) or "nothing"


def _fits(need: Mapping[str, float], have: Mapping[str, float]) -> bool:
    return all(have.get(name, 0.0) + 1e-9 >= amount for name, amount in need.items())


def waits(demand: Demand, waiting: Iterable[Mapping[str, float]]) -> bool:
    """Whether Ray lists a demand of this shape among those it could not place (its pending demands)."""
    mine = demand.resources()
    return any(
        set(shape) == set(mine) and all(abs(shape[k] - mine[k]) <= 1e-6 * max(1.0, mine[k]) for k in mine)
        for shape in waiting
    )


def pending_placement(demand: Demand, nodes: Sequence[NodeView], waiting: bool) -> PendingPlacement | None:
    """Why a demand that Ray has not placed waits (None: it is being placed, its worker starting).

    No node with the region's label, or none large enough, is reported whatever Ray says: such a
    demand cannot be placed until the cluster changes. A demand some node could hold is reported
    when Ray says it waits (`waiting`).
    """
    need = demand.resources()
    candidates = [n for n in nodes if demand.region is None or n.region == demand.region]
    if not candidates:
        regions = sorted({n.region for n in nodes if n.region is not None})
        labels = ", ".join(f"{REGION_LABEL}={r}" for r in regions)
        known = f"nodes are labelled {labels}" if regions else "no node has one"
        return PendingPlacement(
            "no-node-in-region", f"no alive node has the label {REGION_LABEL}={demand.region} ({known})"
        )
    where = f" in region {demand.region}" if demand.region is not None else ""
    if not any(_fits(need, n.total) for n in candidates):
        short = []
        for name, amount in need.items():
            largest = max(candidates, key=lambda n: n.total.get(name, 0.0))
            most = largest.total.get(name, 0.0)
            if most + 1e-9 < amount:
                short.append(f"{name} {_amount(name, amount)} (the most any node{where} has is {_amount(name, most)})")
        return PendingPlacement("too-large", f"no node{where} is large enough: it needs {'; '.join(short)}")
    if not waiting:
        return None
    free = "; ".join(f"node {n.node_id[:8]}: {describe_resources(_subset(n.available, need))}" for n in candidates)
    return PendingPlacement(
        "no-room", f"waiting for room: it needs {describe_resources(need)}; free now{where}: {free}"
    )


def _subset(resources: Mapping[str, float], names: Iterable[str]) -> dict[str, float]:
    return {name: resources.get(name, 0.0) for name in names}
