"""A fleet of models on shared nodes: each model's trace through its own variants and policy, every
model's replicas packed together onto nodes of one memory size. What `tandem sim --trace MODEL=PATH ...` runs.

Each (model, variant, policy) is simulated on its own, by the real controller, policy and router
(`experiment.run_pair`): models share nodes, not replicas, so one model's traffic never changes
another's replica count. A *scenario* picks one variant per model and one policy for all; its
replicas, moment by moment (starting, ready and draining ones: all hold memory), are packed onto
nodes first-fit decreasing (tandem.schedule.packing, as the backends place them), which gives the
fleet's node-hours, its peak node count and the memory it holds. The scenarios that differ in one
model's variant (baseline vs int8) show what that optimization is worth to the whole fleet: fewer
replica-hours where it is faster, and room freed for the other models where it is smaller.

A replica's memory is its Profile's weights plus its KV budget (`Profile.memory_bytes`), as the
single-model `--node-memory-gb` counts it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.schedule.packing import NodeShape, PackItem, nodes_needed
from tandem.sim.experiment import PairResult, SimVariant, Slo, run_pair
from tandem.sim.simulator import SimConfig
from tandem.sim.trace import TraceRequest

__all__ = ["FleetModel", "NodeUse", "Scenario", "pack_over_time", "run_fleet"]

GiB = 1 << 30


@dataclass(frozen=True)
class FleetModel:
    name: str
    trace: tuple[TraceRequest, ...]
    variants: tuple[SimVariant, ...]

    def __post_init__(self) -> None:
        if not self.name or not self.variants:
            raise ValueError("a model of the fleet needs a name and at least one variant")
        if not self.trace:
            raise ValueError(f"model {self.name!r}: no requests in its trace's window")


@dataclass(frozen=True)
class NodeUse:
    node_seconds: float
    peak_nodes: int
    peak_memory_bytes: int
    memory_byte_seconds: float  # held memory integrated over the window


def pack_over_time(
    held: Mapping[str, Sequence[tuple[float, int]]],
    memory: Mapping[str, int],
    node: NodeShape,
    duration_s: float,
    accelerators: Mapping[str, int] | None = None,
) -> NodeUse:
    """Nodes the models' replicas occupy over [0, duration_s), packed together at every change.

    `held`: per model, (time, replicas holding memory) at each change (SimResult.held); `memory`:
    one replica's bytes per model."""
    names = sorted(held)
    counts = {name: 0 for name in names}
    cache: dict[tuple[int, ...], int] = {}
    totals = {"node_s": 0.0, "byte_s": 0.0, "nodes": 0, "bytes": 0}

    def nodes_for(key: tuple[int, ...]) -> int:
        if key not in cache:
            items = [
                PackItem(name, memory[name], (accelerators or {}).get(name, 0))
                for name, n in zip(names, key, strict=True)
                for _ in range(n)
            ]
            cache[key] = nodes_needed(items, node) if items else 0
        return cache[key]

    def hold(start: float, end: float) -> None:
        nodes = nodes_for(tuple(counts[name] for name in names))
        held_bytes = sum(memory[name] * counts[name] for name in names)
        totals["node_s"] += nodes * (end - start)
        totals["byte_s"] += held_bytes * (end - start)
        totals["nodes"], totals["bytes"] = max(totals["nodes"], nodes), max(totals["bytes"], held_bytes)

    now = 0.0
    for t, name, n in sorted((t, name, n) for name, series in held.items() for t, n in series):
        if t >= duration_s:
            break
        if t > now:
            hold(now, t)
            now = t
        counts[name] = n
    if now < duration_s:
        hold(now, duration_s)
    return NodeUse(totals["node_s"], int(totals["nodes"]), int(totals["bytes"]), totals["byte_s"])


@dataclass(frozen=True)
class Scenario:
    policy: str
    pairs: tuple[tuple[FleetModel, PairResult], ...]  # one per model, in the order given
    nodes: NodeUse | None
    duration_s: float

    def row(self) -> dict[str, Any]:
        day = 86400.0 / self.duration_s if self.duration_s else 0.0
        models = []
        for model, pair in self.pairs:
            one = pair.row()
            models.append({
                "model": model.name, "variant": pair.variant.name, "recipe": pair.variant.profile.recipe,
                "replica_memory_bytes": pair.variant.profile.memory_bytes,
                "replica_hours_per_day": one["replica_hours_per_day"], "mean_replicas": one["mean_replicas"],
                "peak_replicas": one["peak_replicas"], "slo_attainment": one["slo_attainment"],
                "ttft_p99_s": one["ttft_p99_s"], "requests": one["requests"], "lost": one["lost"],
                "unserved": one["unserved"], "cost_usd_per_day": one["cost_usd_per_day"],
            })  # fmt: skip
        costs = [m["cost_usd_per_day"] for m in models]
        row: dict[str, Any] = {
            "policy": self.policy,
            "variants": {m["model"]: m["variant"] for m in models},
            "replica_hours_per_day": sum(m["replica_hours_per_day"] for m in models),
            "cost_usd_per_day": sum(costs) if all(c is not None for c in costs) else None,
            "slo_attainment_min": min(m["slo_attainment"] for m in models),
            "lost": sum(m["lost"] for m in models),
            "models": models,
        }
        if self.nodes is not None:
            row.update({
                "node_hours_per_day": self.nodes.node_seconds / 3600.0 * day,
                "peak_nodes": self.nodes.peak_nodes,
                "peak_memory_gib": self.nodes.peak_memory_bytes / GiB,
                "mean_memory_gib": self.nodes.memory_byte_seconds / self.duration_s / GiB if self.duration_s else 0.0,
            })  # fmt: skip
        return row


def run_fleet(
    models: Sequence[FleetModel],
    policies: Sequence[str],
    slo: Slo,
    *,
    duration_s: float,
    config: SimConfig | None = None,
    node: NodeShape | None = None,
    max_replicas: int = 256,
    utilization: float = 0.7,
    progress: Callable[[str], None] | None = None,
) -> list[Scenario]:
    """Every scenario: each policy x one variant per model (all combinations), models in the order given."""
    if len({m.name for m in models}) != len(models):
        raise ValueError("model names must differ")
    runs: dict[tuple[str, str, str], PairResult] = {}
    for model in models:
        for variant in model.variants:
            for policy in policies:
                if progress:
                    progress(f"simulating {model.name}: {variant.name} x {policy}")
                runs[(model.name, variant.name, policy)] = run_pair(
                    model.trace, variant, policy, slo, duration_s=duration_s, config=config,
                    max_replicas=max_replicas, utilization=utilization,
                )  # fmt: skip
    scenarios = []
    for policy in policies:
        for choice in itertools.product(*(m.variants for m in models)):
            pairs = tuple((m, runs[(m.name, v.name, policy)]) for m, v in zip(models, choice, strict=True))
            use = None
            if node is not None:
                use = pack_over_time(
                    {m.name: p.sim.held for m, p in pairs},
                    {m.name: p.variant.profile.memory_bytes for m, p in pairs},
                    node,
                    duration_s,
                    {m.name: p.variant.profile.accelerators for m, p in pairs} if node.accelerators else None,
                )
            scenarios.append(Scenario(policy, pairs, use, duration_s))
    return scenarios
