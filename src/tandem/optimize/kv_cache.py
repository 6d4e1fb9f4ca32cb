"""`kv-bf16`: keys and values cached in bfloat16 (vLLM's --kv-cache-dtype, for this CPU).

Decode attention reads every running sequence's cached keys and values each step; on the bench
workload that is about 40% of the int8 recipe's time, and no weight format touches it. Storing the
cache in bfloat16 halves those bytes (and the cache's memory: twice the sequences per byte). Prompt
attention still runs on the fresh fp32 keys; cached attention casts the queries to bfloat16 and
its output back. Composes with any weight recipe: `int8+kv-bf16+ngram`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.optimize.types import OptimizedModel

__all__ = ["KvBFloat16"]


@dataclass(frozen=True)
class KvBFloat16:
    name: str = "kv-bf16"
    version: str = "1.0"
    description: str = "KV cache in bfloat16: half the bytes decode attention reads, twice the sequences per byte"

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        return model.with_changes(kv_cache_dtype="bfloat16")
