"""EngineConfig: one replica engine's limits (context, KV budget, slots, prefill chunk, threads,
prefix caching), and the KV cache's dtype by name."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["EngineConfig", "kv_dtype_named"]


@dataclass(frozen=True)
class EngineConfig:
    max_model_len: int | None = None  # context limit per sequence; default min(model's, 2048)
    kv_cache_tokens: int = 32768  # KV memory budget in tokens, preallocated as blocks of prefix_block_size
    max_num_seqs: int = 64  # upper bound on concurrently running sequences
    max_prefill_tokens: int = 512  # prompt tokens prefilled per step, so long prompts don't stall decode
    num_threads: int | None = None  # torch threads for this engine; default all cores
    enable_prefix_caching: bool = True  # share the KV blocks of identical prompt prefixes (tandem.engine.kv_blocks)
    prefix_block_size: int = 16  # tokens per KV block: prefixes are matched and shared in whole blocks
    kv_hash_seed: int = 0  # the seed of the blocks' hash chain (tandem.contracts.kv_block_hash), in GET /load
    # The most of the running slots one request's sequences (its choices) hold while others wait for one
    # (tandem.engine.batcher); sequences without a request group are not limited.
    max_request_share: float = 0.25

    def resolve_max_len(self, model_max: int) -> int:
        limit = self.max_model_len or min(model_max, 2048)
        if limit > model_max:
            raise ValueError(f"max_model_len {limit} exceeds the model's max_position_embeddings {model_max}")
        return limit


def kv_dtype_named(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"kv_cache_dtype {name!r} is not a torch floating-point dtype")
    return dtype
