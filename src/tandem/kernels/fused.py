"""Fused float32 layer pieces for the serving forward (vLLM's CPU custom ops, in one pass each).

Each replaces several torch ops, and their dispatch, per layer: at decode sizes dispatch costs
more than the arithmetic. Inference only (no autograd); callers keep torch paths for training,
other dtypes, and machines without the kernels.
"""

from __future__ import annotations

import torch

from tandem.kernels.build import check_kv_cache, kernel_library

__all__ = ["rope_and_cache", "rms_norm", "silu_mul"]


def _check(name: str, tensor: torch.Tensor, contiguous: bool = True) -> None:
    if tensor.dtype != torch.float32 or (contiguous and not tensor.is_contiguous()):
        raise ValueError(f"{name} must be a contiguous float32 tensor")


def rope_and_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    offsets: torch.Tensor,
    blocks: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    heads: int,
) -> None:
    """qkv: [N, (heads + 2 kv_heads) * head_dim], the fused projection. Rotates its q and k parts in
    place (cos/sin: [N, head_dim], each token's rows of the rotary tables) and writes k and v to the
    paged cache (keys/values: [kv_heads, blocks, block_size, head_dim], float32 or bfloat16) in each
    token's block, at its offset inside the block."""
    n = qkv.shape[0]
    kv_heads, num_blocks, block_size, head_dim = keys.shape
    if qkv.dtype != torch.float32 or qkv.stride(-1) != 1 or qkv.shape[1] != (heads + 2 * kv_heads) * head_dim:
        raise ValueError("qkv must be float32 [N, (heads + 2 kv_heads) * head_dim] with unit column stride")
    for name, table in (("cos", cos), ("sin", sin)):
        _check(name, table)
        if table.shape != (n, head_dim):
            raise ValueError(f"{name} must be [N, head_dim]")
    check_kv_cache(keys, values)
    offsets, blocks = offsets.long().contiguous(), blocks.long().contiguous()
    kernel_library().tandem_rope_and_cache(
        qkv.data_ptr(),
        qkv.stride(0),
        n,
        cos.data_ptr(),
        sin.data_ptr(),
        offsets.data_ptr(),
        blocks.data_ptr(),
        keys.data_ptr(),
        values.data_ptr(),
        int(keys.dtype == torch.bfloat16),
        heads,
        kv_heads,
        head_dim,
        block_size,
        num_blocks,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of x ([..., W], float32): a new tensor. With residual (x's shape),
    first adds it into x in place, so x becomes the residual stream's next value."""
    _check("x", x)
    _check("weight", weight)
    if residual is not None:
        _check("residual", residual)
        if residual.shape != x.shape:
            raise ValueError("residual must have x's shape")
    width = x.shape[-1]
    out = torch.empty_like(x)
    kernel_library().tandem_rms_norm(
        x.data_ptr(),
        None if residual is None else residual.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        x.numel() // width,
        width,
        eps,
    )
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] -> [..., I]: silu(first half) * second half."""
    _check("gate_up", gate_up)
    inter = gate_up.shape[-1] // 2
    out = gate_up.new_empty((*gate_up.shape[:-1], inter))
    kernel_library().tandem_silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * inter), inter)
    return out
