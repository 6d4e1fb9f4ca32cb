"""Varlen decode attention over a paged KV cache: each row reads only its own keys, through its block table.

The cache is a pool of fixed-size blocks, head-major ([kv_heads, blocks, block_size, head_dim] per
layer: a sequence's blocks taken in order are one stream per kv head); a
row's keys are wherever its sequence's block table says (blocks shared by sequences with one prefix
are read in place). The torch path (tandem.model.transformer) gathers the rows' blocks and masks;
this kernel takes every cached row in one call, whatever its length or number of new tokens.
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
    tables: torch.Tensor,
    starts: torch.Tensor,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """q: [N, heads, head_dim], the new tokens of every row laid out flat; row r's lengths[r] tokens
    start at q[offsets[r]] and sit at positions starts[r].. of its sequence, whose position p is in
    block tables[r, p // block_size] at offset p % block_size (keys/values: [kv_heads, blocks,
    block_size, head_dim], float32 or bfloat16; tables: [R, W] long, W blocks covering every row's
    starts[r] + lengths[r] positions), the new tokens' keys and values already written.
    Returns [N, heads, head_dim] in q's dtype: causal attention of each token over its row's keys."""
    library = kernel_library()
    if library is None:
        raise RuntimeError("the C kernels are not available (see the warning when they were loaded)")
    n, heads, head_dim = q.shape
    kv_heads, num_blocks, block_size, _ = keys.shape
    check_kv_cache(keys, values)
    if heads % kv_heads or head_dim > 256:
        raise ValueError(f"unsupported shape: {heads} heads, {kv_heads} kv heads, head_dim {head_dim}")
    if tables.dim() != 2 or tables.shape[0] != len(offsets):
        raise ValueError(f"tables must be [rows, blocks], one row per row of offsets; got {tuple(tables.shape)}")
    if int((starts + lengths).max()) > tables.shape[1] * block_size:
        raise ValueError("a row's block table does not cover its positions")
    dtype = q.dtype
    if dtype != torch.float32:
        q = q.float()
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        q = q.contiguous()
    index = [
        t if t.dtype == torch.long and t.is_contiguous() else t.long().contiguous()
        for t in (offsets, lengths, starts, tables)
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
        tables.shape[1],
        heads,
        kv_heads,
        head_dim,
        block_size,
        num_blocks,
        sliding_window or 0,
        1.0 / math.sqrt(head_dim),
    )
    if failed:
        raise MemoryError("varlen attention: could not allocate its per-thread scratch")
    return out if dtype == torch.float32 else out.to(dtype)
