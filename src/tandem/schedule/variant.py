"""Variant: one way of serving the model (a recipe), what it can do (its Profile), and how to start it.

The scheduling layer is handed variants; it never knows how a recipe makes a replica fast. A new
optimizer reaches production as a new Variant (a recipe name plus its measured Profile), rolled out
with `Controller.use(variant)`.

What a replica needs from a node (for backends that place replicas: Ray) comes with the variant:
its memory is given (`memory_bytes`) or follows from its Profile (`replica_memory_bytes`), its CPUs
are its threads, and accelerators are asked for explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.cluster.backend import ReplicaSpec
from tandem.cluster.external import ExternalEngine
from tandem.contracts import Profile

__all__ = ["DEFAULT_KV_CACHE_TOKENS", "REPLICA_RUNTIME_BYTES", "Variant", "replica_memory_bytes"]

DEFAULT_KV_CACHE_TOKENS = 32768  # a replica's KV budget unless --kv-cache-tokens says (tandem serve's default)
# What a replica holds besides its weights and KV cache: Python, torch, the tokenizer, the server.
# Measured on the bundled model (VmRSS of `tandem serve --threads 1`, ready, after one request, less
# weights and KV): about 437 MiB (baseline) and 474 MiB (int8+kv-bf16+ngram).
REPLICA_RUNTIME_BYTES = 448 << 20


def replica_memory_bytes(profile: Profile, kv_cache_tokens: int = DEFAULT_KV_CACHE_TOKENS) -> int:
    """Memory one replica of a measured variant needs: weights, its whole KV budget (the engine
    preallocates it), and the runtime around them."""
    return profile.weight_bytes + profile.kv_bytes_per_token * kv_cache_tokens + REPLICA_RUNTIME_BYTES


@dataclass(frozen=True)
class Variant:
    name: str  # how routing, metrics and the deployment file call it
    recipe: str | None  # the optimizer recipe, as text ("int8+speculative(k=4)"); None: the replicas' default
    profile: Profile | None = None  # measured; required by the capacity policy
    model: str | None = None  # the model directory (None: the bundled default)
    threads: int | None = None  # torch threads per replica
    extra_args: tuple[str, ...] = ()  # more `tandem serve` flags, verbatim
    memory_bytes: int | None = None  # reserved per replica; None: from the Profile (none without one)
    accelerators: float = 0.0  # accelerators (GPUs) per replica
    accelerator_type: str | None = None  # a kind of accelerator ("A100"), where the cluster has several
    usd_per_hour: float | None = None  # price of one replica-hour (the gate's unit cost); None: tandem's pinned default
    engine: ExternalEngine | None = None  # an external server runs its replicas (None: `tandem serve`)

    def __post_init__(self) -> None:
        if not self.name or self.recipe == "":
            raise ValueError("a Variant needs a name, and a recipe that is None (the default) or not empty")

    @property
    def replica_memory(self) -> int:
        """Bytes reserved for each replica (0: none; a backend then places it by CPUs alone)."""
        if self.memory_bytes is not None:
            return self.memory_bytes
        return replica_memory_bytes(self.profile) if self.profile is not None else 0

    def spec(self, region: str = "local") -> ReplicaSpec:
        """What a backend needs to start one replica of this variant in `region`."""
        return ReplicaSpec(
            variant=self.name,
            recipe=self.recipe,
            model=self.model,
            region=region,
            threads=self.threads,
            extra_args=self.extra_args,
            memory_bytes=self.replica_memory,
            accelerators=self.accelerators,
            accelerator_type=self.accelerator_type,
            engine=self.engine,
        )
