"""The cross-layer contract: what the optimization layer and the scheduling layer say to each other.

Standard library only, so the scheduling layer can import it without pulling in torch. The
optimization layer makes replicas fast and describes them with a measured Profile; the scheduling
layer sizes and routes with Profiles and ReplicaLoads, never knowing how a replica is made fast.
Only what crosses the two layers is here: the optimization layer's own types (OptimizedModel,
InferenceOptimizer) are tandem.optimize.types; the gate's HTTP side channel to a replica is
tandem.edge.keep_track.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "KV_EVENTS_PATH",
    "PRIORITY_HEADER",
    "PROFILE_SOURCES",
    "KVEvents",
    "Profile",
    "ReplicaLoad",
    "kv_block_hash",
    "kv_block_hashes",
]

PROFILE_SOURCES = ("measured", "imported", "projected")
# gateway -> replica: the request's priority in vLLM's sense (an integer, lower admitted first), from its tenant
PRIORITY_HEADER = "x-tandem-priority"


@dataclass(frozen=True)
class Profile:
    """A measured description of one optimized variant on one kind of hardware. JSON round-trips.

    `source` says where the numbers come from: "measured" (by `tandem profile` on `hardware`),
    "imported" (built from someone else's measurements, e.g. the splitwise GPU timings) or
    "projected" (a measured or imported Profile with a stated factor applied; `source_note` states
    it). A replica spans `accelerators` devices (its tensor-parallel degree). `kv_cache_tokens` is
    the KV budget in tokens (0: `max_slots` slots of `max_model_len`, tandem's engine). The last four
    fields came later; JSON without them still loads (measured, 1 accelerator, slot-sized KV).
    """

    recipe: str  # "int8+speculative(k=4)"
    hardware: str  # "cpu-2c-avx512", "h100-80gb"
    model: str
    weight_bytes: int
    kv_bytes_per_token: int
    max_slots: int
    decode_tokens_per_s: dict[int, float]  # batch size -> output tokens/s, measured
    prefill_tokens_per_s: float
    ttft_s_p50: float
    cold_start_s: float
    max_model_len: int = 0
    measured_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = "measured"
    source_note: str = ""
    accelerators: int = 1
    kv_cache_tokens: int = 0

    def __post_init__(self) -> None:
        if self.source not in PROFILE_SOURCES:
            raise ValueError(f"Profile source must be one of {', '.join(PROFILE_SOURCES)} (got {self.source!r})")
        if self.accelerators < 1 or self.kv_cache_tokens < 0:
            raise ValueError("a Profile needs accelerators >= 1 and kv_cache_tokens >= 0")

    @property
    def kv_budget_tokens(self) -> int:
        """Tokens of KV cache one replica holds."""
        return self.kv_cache_tokens or self.max_slots * self.max_model_len

    @property
    def memory_bytes(self) -> int:
        """What one replica occupies: its weights plus its KV budget."""
        return self.weight_bytes + self.kv_budget_tokens * self.kv_bytes_per_token

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        raw = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"unknown Profile field(s): {', '.join(unknown)}")
        raw["decode_tokens_per_s"] = {int(k): float(v) for k, v in raw["decode_tokens_per_s"].items()}
        return cls(**raw)

    def decode_capacity(self, batch: int) -> float:
        """Output tokens/s at `batch` concurrent sequences, interpolated between measured sizes."""
        points = sorted(self.decode_tokens_per_s.items())
        if not points:
            return 0.0
        if batch <= points[0][0]:
            return points[0][1] * batch / points[0][0]
        for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False):
            if batch <= b1:
                return t0 + (t1 - t0) * (batch - b0) / (b1 - b0)
        return points[-1][1]


@dataclass(frozen=True)
class ReplicaLoad:
    """A running replica's report to the scheduling layer."""

    replica_id: str
    region: str
    variant: str
    running: int
    waiting: int
    kv_used: float  # fraction of the KV budget in use
    healthy: bool
    # Who measured it: "tandem" (the replica's GET /load), an external engine's metrics adapter
    # ("vllm", "sglang", "llamacpp"), or "gateway-inflight" (the gateway's own count of requests).
    source: str = "tandem"
    prefill_tokens: int = 0  # prompt tokens admitted and not yet prefilled (0: not reported)


# --- KV events: which prefix blocks a replica holds (replica -> gateway's kv-aware router) ---------

KV_EVENTS_PATH = "/kv/events"  # GET ?since=SEQ on a replica, behind the fleet's secret


def kv_block_hash(parent: int | None, tokens: Sequence[int], seed: int = 0) -> int:
    """One link of a prefix's hash chain, the same in every process and language: the first 8 bytes
    (big-endian, unsigned) of sha256(seed as 8 bytes | parent as 8 bytes (0 for the first block) |
    each token id as 4 bytes little-endian). A block's hash covers its tokens and, through the
    parent, every token before them, as in vLLM's prefix caching."""
    digest = hashlib.sha256()
    digest.update(seed.to_bytes(8, "big"))
    digest.update((parent or 0).to_bytes(8, "big"))
    digest.update(b"".join(int(t).to_bytes(4, "little") for t in tokens))
    return int.from_bytes(digest.digest()[:8], "big")


def kv_block_hashes(ids: Sequence[int], block_size: int, seed: int = 0) -> list[int]:
    """The hash chain of the full blocks of `ids` (a partial last block has no hash)."""
    hashes: list[int] = []
    parent: int | None = None
    for lo in range(0, len(ids) - block_size + 1, block_size):
        parent = kv_block_hash(parent, ids[lo : lo + block_size], seed)
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class KVEvents:
    """A replica's answer to GET /kv/events?since=SEQ: the block hashes stored and removed after
    event `since`, up to `seq` (the newest event's number). `reset` True: the replica cannot say
    what changed since `since` (it restarted, or the gap is older than what it keeps): `stored`
    is then every block it holds now and the reader drops what it knew. Hashes are
    `kv_block_hash` with the replica's `block_size` and `hash_seed` (also in GET /load)."""

    seq: int
    block_size: int
    hash_seed: int
    reset: bool
    stored: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "block_size": self.block_size,
            "hash_seed": self.hash_seed,
            "reset": self.reset,
            "stored": list(self.stored),
            "removed": list(self.removed),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KVEvents:
        return cls(
            seq=int(data["seq"]),
            block_size=int(data["block_size"]),
            hash_seed=int(data["hash_seed"]),
            reset=bool(data["reset"]),
            stored=tuple(int(h) for h in data.get("stored", ())),
            removed=tuple(int(h) for h in data.get("removed", ())),
        )
