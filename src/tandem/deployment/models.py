"""A fleet of models as the rest of tandem reads it: frozen dataclasses (what `parse_fleet` returns).

Each served model is one `Deployment`, exactly what a single-model file is (variants, fallback,
breakers, policy, router, gate); the fleet adds the names clients send as `model` and the nodes'
memory budget. A single-model file is a fleet of one model with no name (`routed` False): requests
are not routed by `model`, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.deployment.model import BackendPlan, Deployment

__all__ = ["FleetPlan", "NodeBudget", "ServedModel"]


@dataclass(frozen=True)
class NodeBudget:
    """What a node offers replicas. `memory_bytes` None: the backend's own default (local: this
    machine's RAM less a margin; Ray: what each node reports)."""

    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError("NodeBudget.memory_bytes must be > 0")


@dataclass(frozen=True)
class ServedModel:
    """One model of the fleet: `name` is what clients send as "model" ("" in a single-model file)."""

    name: str
    deployment: Deployment


@dataclass(frozen=True)
class FleetPlan:
    models: tuple[ServedModel, ...]
    nodes: NodeBudget = NodeBudget()

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        if not names or len(set(names)) != len(names):
            raise ValueError("a FleetPlan needs at least one model, each with its own name")
        if "" in names and len(names) > 1:
            raise ValueError("only a single-model fleet has a model without a name")

    @property
    def routed(self) -> bool:
        """Whether requests pick their model by name (a `models:` file), rather than all going to one."""
        return self.models[0].name != ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    @property
    def backend(self) -> BackendPlan:
        """Where every model's replicas run (the file's one `backend:`)."""
        return self.models[0].deployment.backend

    def model(self, name: str) -> Deployment:
        return next(m.deployment for m in self.models if m.name == name)
