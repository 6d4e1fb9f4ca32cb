"""Memory as a resource: what a replica needs, where it fits, and whom to scale down to make room. Pure.

**A replica's need** is known before it starts: its variant's `resources.memory` if given, else from
its Profile (weights + its whole KV budget, which the engine preallocates, + the runtime around them:
`tandem.schedule.variant.replica_memory_bytes`), else estimated from the model's config and the
recipe's bits (`estimate_replica_memory`: parameters x bits, the KV cache at its dtype, the same
runtime). `memory_need(variant)` is the first of those three that is known (0: none is).

**Nodes and placement** are the cluster layer's (tandem.cluster.room, re-exported here): a node has a
budget (`nodes.memory` / `--node-memory-gb` locally, default this machine's RAM less 10% or 1 GiB,
whichever is more; a Ray node's `memory` resource), `place(need, nodes, placed)` is first fit and
says why nothing fits (`no room: needs 412 MiB, free 128 MiB on node local`; `too large: ...`), and
waiting replicas are placed largest first as room frees (first-fit decreasing).

**Making room** (`choose_evictions`): when a model needs a replica *now* (a request waits for it)
and no node has room, the planner may scale other models down. The contract:

- candidates are replicas of *other* models (never the one asking), each with its memory, its
  node, how long its model has been idle (no request in flight or waiting), and how many replicas
  its model may lose and stay at or above its `min` (`spare`: live - min);
- a model that is not idle (idle_s < `min_idle_s`) or has no spare replica gives none; a model is
  never taken below its `min`, however many of its replicas are candidates (the issue's "those at
  their minimum": models whose traffic asks for no more than their min, so what they hold above
  it is idle);
- on each node, candidates go idle-longest first (ties: the larger first, so fewer go; then by
  id), and the shortest such run whose bytes, with what the node has free, hold the need is that
  node's plan; the plan chosen is the one whose least idle victim has been idle longest (then the
  fewest victims, then the node listed first): scaling down what was used least recently, as an
  LRU cache evicts;
- when no node can be made to hold the need, nothing is evicted (None): the replica waits pending
  with its reason rather than costing other models a replica for nothing.

The caller drains the victims (in-flight requests finish, none is cut), and the backend places the
waiting replica once their processes have exited.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tandem.cluster.room import (
    LOCAL_NODE,
    NodeBudget,
    NodeRoom,
    format_bytes,
    local_memory_budget,
    machine_memory_bytes,
    place,
    placing_order,
)
from tandem.schedule.variant import DEFAULT_KV_CACHE_TOKENS, REPLICA_RUNTIME_BYTES, Variant

__all__ = [
    "LOCAL_NODE",
    "EvictionCandidate",
    "Evictions",
    "MemoryEstimate",
    "ModelShape",
    "NodeBudget",
    "NodeRoom",
    "RecipeBits",
    "choose_evictions",
    "estimate_replica_memory",
    "format_bytes",
    "local_memory_budget",
    "machine_memory_bytes",
    "memory_need",
    "place",
    "placing_order",
    "recipe_bits",
]


def memory_need(variant: Variant) -> int:
    """Bytes one replica of `variant` needs: given, or from its Profile (0: neither is known)."""
    return variant.replica_memory


# --- estimating a need from a model's config ------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What a decoder-only transformer's config.json says about its size (Llama, Mistral, Qwen2 names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool = True
    dtype_bits: int = 16  # the checkpoint's dtype (torch_dtype)

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> ModelShape:
        """From a Hugging Face config.json (already parsed); ValueError naming a missing field."""

        def number(*names: str, default: int | None = None) -> int:
            for name in names:
                value = config.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
            if default is None:
                raise ValueError(f"the model's config has no {names[0]} (a positive integer)")
            return default

        hidden = number("hidden_size", "n_embd", "d_model")
        heads = number("num_attention_heads", "n_head")
        dtype = str(config.get("torch_dtype") or "float32")
        return cls(
            vocab_size=number("vocab_size"),
            hidden_size=hidden,
            intermediate_size=number("intermediate_size", "n_inner", default=4 * hidden),
            layers=number("num_hidden_layers", "n_layer"),
            heads=heads,
            kv_heads=number("num_key_value_heads", default=heads),
            head_dim=number("head_dim", default=hidden // heads),
            tied_embeddings=bool(config.get("tie_word_embeddings", True)),
            dtype_bits={"float32": 32, "float16": 16, "bfloat16": 16}.get(dtype, 16),
        )

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def linear_parameters(self) -> int:
        """The layers' projections: attention (q, k, v, o) and the gated MLP (gate, up, down)."""
        q_and_o = 2 * self.hidden_size * self.heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.kv_heads * self.head_dim
        return self.layers * (q_and_o + k_and_v + 3 * self.hidden_size * self.intermediate_size)

    @property
    def norm_parameters(self) -> int:
        return (2 * self.layers + 1) * self.hidden_size

    def kv_elements_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class RecipeBits:
    """Bits per weight of the layers' projections, of embeddings and norms, and per KV element."""

    linear: int
    other: int
    kv: int


# What tandem's built-in optimizers do to the bits (a replica validates its own recipe; this is an
# estimate for placement when no Profile was measured). Unknown steps (ngram, speculative(k=4), a
# third-party optimizer) leave the bits as they are.
_WEIGHT_STEPS = {"int8": 8, "int4": 4}
_KV_STEPS = {"kv-bf16": 16}


def recipe_bits(recipe: str | None, base_bits: int = 32) -> RecipeBits:
    """The bits a recipe serves at, from `base_bits` (tandem's engine: float32; an external engine: the
    checkpoint's dtype). int8/int4 quantize the projections (embeddings and norms stay); bf16 casts
    everything, the KV cache too; kv-bf16 casts the KV cache only. None (the replica's own default,
    not known on this side) is estimated as baseline: the largest, so it never overcommits a node."""
    linear = other = kv = base_bits
    for step in (recipe or "baseline").split("+"):
        name = step.split("(")[0].strip()
        if name == "bf16":
            linear = other = kv = 16
        elif name in _WEIGHT_STEPS:
            linear = _WEIGHT_STEPS[name]
        elif name in _KV_STEPS:
            kv = _KV_STEPS[name]
    return RecipeBits(linear, other, kv)


@dataclass(frozen=True)
class MemoryEstimate:
    weight_bytes: int
    kv_bytes_per_token: int
    kv_cache_tokens: int
    runtime_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes_per_token * self.kv_cache_tokens + self.runtime_bytes


def estimate_replica_memory(
    shape: ModelShape,
    recipe: str | None,
    kv_cache_tokens: int = DEFAULT_KV_CACHE_TOKENS,
    base_bits: int = 32,
    runtime_bytes: int = REPLICA_RUNTIME_BYTES,
) -> MemoryEstimate:
    """A replica's memory from its model's shape and its recipe's bits: weights, the whole KV budget
    and the runtime. An estimate (an engine may hold a packed copy of some weights: a measured
    Profile is exact and wins)."""
    bits = recipe_bits(recipe, base_bits)
    other = shape.embedding_parameters + shape.norm_parameters
    weights = (shape.linear_parameters * bits.linear + other * bits.other) // 8
    return MemoryEstimate(weights, shape.kv_elements_per_token() * bits.kv // 8, kv_cache_tokens, runtime_bytes)


# --- making room -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvictionCandidate:
    """A replica another model might give up. `spare`: how many replicas its model may lose and stay
    at or above its `min` (its live count less its min; the same on each of its candidates)."""

    replica_id: str
    model: str
    memory_bytes: int
    idle_s: float  # how long its model has had no request in flight or waiting
    spare: int
    node: str = LOCAL_NODE


@dataclass(frozen=True)
class Evictions:
    """Scale these replicas down to place the need on `node`."""

    node: str
    replica_ids: tuple[str, ...]
    freed_bytes: int


def choose_evictions(
    need: int,
    free: Mapping[str, int],
    candidates: Sequence[EvictionCandidate],
    *,
    for_model: str,
    min_idle_s: float = 0.0,
) -> Evictions | None:
    """Which other models' replicas to scale down so `need` bytes fit on one node (module docstring).

    `free`: bytes free on each node now, by name (a node absent is taken to have none free, so only
    its candidates' bytes count). None: no node can be made to hold the need without taking a model
    below its min or scaling down a model that is not idle; or one already has room (nothing to do)."""
    if need <= 0 or any(room >= need for room in free.values()):
        return None
    usable = [c for c in candidates if c.model != for_model and c.idle_s >= min_idle_s and c.spare > 0]
    order = sorted(usable, key=lambda c: (-c.idle_s, -c.memory_bytes, c.replica_id))
    nodes = list(dict.fromkeys([*free, *(c.node for c in order)]))
    plans: list[tuple[float, int, int, Evictions]] = []
    for index, node in enumerate(nodes):
        room, taken, victims = free.get(node, 0), {}, []
        for candidate in (c for c in order if c.node == node):
            if taken.get(candidate.model, 0) >= candidate.spare:
                continue  # its model is at its min
            taken[candidate.model] = taken.get(candidate.model, 0) + 1
            victims.append(candidate)
            room += candidate.memory_bytes
            if room >= need:
                freed = sum(v.memory_bytes for v in victims)
                plan = Evictions(node, tuple(v.replica_id for v in victims), freed)
                plans.append((-victims[-1].idle_s, len(victims), index, plan))
                break
    return min(plans, key=lambda p: p[:3])[3] if plans else None
