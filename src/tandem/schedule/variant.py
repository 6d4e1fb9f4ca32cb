"""Variant: one way of serving the model (a recipe), what it can do (its Profile), and how to start it.

The scheduling layer is handed variants; it never knows how a recipe makes a replica fast. A new
optimizer reaches production as a new Variant (a recipe name plus its measured Profile), rolled out
with `Controller.use(variant)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.cluster.backend import ReplicaSpec
from tandem.contracts import Profile

__all__ = ["Variant"]


@dataclass(frozen=True)
class Variant:
    name: str  # how routing, metrics and the deployment file call it
    recipe: str | None  # the optimizer recipe, as text ("int8+speculative(k=4)"); None: the replicas' default
    profile: Profile | None = None  # measured; required by the capacity policy
    model: str | None = None  # the model directory (None: the bundled default)
    threads: int | None = None  # torch threads per replica
    extra_args: tuple[str, ...] = ()  # more `tandem serve` flags, verbatim

    def __post_init__(self) -> None:
        if not self.name or self.recipe == "":
            raise ValueError("a Variant needs a name, and a recipe that is None (the default) or not empty")

    def spec(self, region: str = "local") -> ReplicaSpec:
        """What a backend needs to start one replica of this variant in `region`."""
        return ReplicaSpec(
            variant=self.name,
            recipe=self.recipe,
            model=self.model,
            region=region,
            threads=self.threads,
            extra_args=self.extra_args,
        )
