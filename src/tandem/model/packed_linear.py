"""PackedLinear: a Linear whose weight is pre-packed once into oneDNN's blocked layout.

On this class of CPU, torch's default fp32 Linear goes through MKL, whose small-batch GEMV reads
weights at ~17 GB/s; oneDNN's inner product on a pre-packed weight reaches the memory bandwidth
(3-4x faster at batch 1-8, fp32 and bf16 alike; numbers in benchmarks/results). Decode is bound by
reading the weights, so this is the single largest speed-up of the forward pass. Same dtype, same
math: only the summation order differs (fp32 outputs within ~1e-6 relative).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PackedLinear", "pack_linears", "packing_available", "packs", "SMALL_WEIGHT_BYTES"]

SMALL_WEIGHT_BYTES = 2 << 20


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN can pack weights of this dtype here. Its bf16 kernels need AVX-512 (BW, VL,
    DQ) or AVX-NE-CONVERT: on an AVX2-only CPU a bf16 Linear stays torch's own (slower, same math)
    instead of failing to start."""
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.weight_bytes = weight.numel() * weight.element_size()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        self.bias = None if linear.bias is None else linear.bias.detach().clone()
        # Small fp32 weights (L2-resident) at one row: MKL's GEMV on the transposed weight skips
        # oneDNN's ~10 us call overhead (2-5x faster for draft-sized layers). At more rows MKL is
        # far slower here, so the packed copy serves those.
        small = weight.dtype == torch.float32 and weight.numel() * 4 <= SMALL_WEIGHT_BYTES
        self.dense_t = weight.t().contiguous() if small else None
        if self.bias is not None:
            self.weight_bytes += self.bias.numel() * self.bias.element_size()
        # Kept for shape-only consumers; not used in forward.
        self.dtype = weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        rows = flat.shape[0]
        if rows == 1 and self.dense_t is not None:
            out = flat @ self.dense_t
            if self.bias is not None:
                out = out + self.bias
            return out.view(*x.shape[:-1], self.out_features)
        # oneDNN builds (and caches) a kernel per row count, ~5 ms each: prompts of every length
        # would each pay it. Above 16 rows, pad to a multiple of 32 so a few kernels serve all.
        padded = rows if rows <= 16 else -(-rows // 32) * 32
        if padded != rows:
            flat = torch.cat([flat, flat.new_zeros(padded - rows, self.in_features)])
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        if padded != rows:
            out = out[:rows]
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}"


def pack_linears(module: nn.Module) -> int:
    """Replace every plain nn.Linear inside `module` by a PackedLinear; returns how many.

    Idempotent. Only exact nn.Linear instances are packed: optimizer-made layers (int8, ...) are
    left to their own kernels.
    """
    if not packing_available():
        return 0
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and packs(child.weight.dtype):
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count
