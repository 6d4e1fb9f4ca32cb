"""The cross-layer contract: what the optimization layer and the scheduling layer say to each other.

Standard library only, so the scheduling layer can import it without pulling in torch. The
optimization layer makes replicas fast and describes them with a measured Profile; the scheduling
layer sizes and routes with Profiles and ReplicaLoads, never knowing how a replica is made fast.
Only what crosses the two layers is here: the optimization layer's own types (OptimizedModel,
InferenceOptimizer) are tandem.optimize.types; the gate's HTTP side channel to a replica is
tandem.edge.keep_track.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "PROFILE_SOURCES",
    "Profile",
    "ReplicaLoad",
]

PROFILE_SOURCES = ("measured", "imported", "projected")


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
