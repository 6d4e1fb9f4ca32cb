"""Varlen decode attention over a KV cache: each row reads only its own keys.

The torch path (tandem.model.transformer) gathers rows of equal width over a contiguous slot range
and masks: rows of mixed lengths then read (and discard) each other's padding, and one call per
width. This kernel takes every cached row in one call, whatever its length or number of new tokens.
"""

from __future__ import annotations

import math

import torch

from tandem.kernels.build import check_kv_cache, kernel_library

__all__ = ["varlen_attention"]


def varlen_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """q: [N, heads, head_dim], the new tokens of every row laid out flat; row r's lengths[r] tokens
    start at q[offsets[r]] and sit at positions starts[r].. of KV slot slots[r], whose keys and values
    (keys/values: [slots, kv_heads, max_len, head_dim], float32 or bfloat16) already hold them.
    Returns [N, heads, head_dim] in q's dtype: causal attention of each token over its row's keys."""
    library = kernel_library()
    if library is None:
        raise RuntimeError("the C kernels are not available (see the warning when they were loaded)")
    n, heads, head_dim = q.shape
    num_slots, kv_heads, max_len, _ = keys.shape
    check_kv_cache(keys, values)
    if heads % kv_heads or head_dim > 256:
        raise ValueError(f"unsupported shape: {heads} heads, {kv_heads} kv heads, head_dim {head_dim}")
    dtype = q.dtype
    if dtype != torch.float32:
        q = q.float()
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    index = [
        t if t.dtype == torch.long and t.is_contiguous() else t.long().contiguous()
        for t in (offsets, lengths, slots, starts)
    ]
    out = torch.empty((n, heads, head_dim), dtype=torch.float32)
    failed = library.tandem_varlen_attention(
        q.data_ptr(),
        q.stride(0),
        out.data_ptr(),
        keys.data_ptr(),
        values.data_ptr(),
        int(keys.dtype == torch.bfloat16),
        len(index[0]),
        *(t.data_ptr() for t in index),
        heads,
        kv_heads,
        head_dim,
        max_len,
        sliding_window or 0,
        1.0 / math.sqrt(head_dim),
    )
    if failed:
        raise MemoryError("varlen attention: could not allocate its per-thread scratch")
    return out if dtype == torch.float32 else out.to(dtype)
