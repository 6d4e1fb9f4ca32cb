"""`int4`: group-wise 4-bit weights (round to nearest, one fp16 scale per group of K) on the
transformer's Linear layers.

Each output channel's weights are cut into groups of `group_size` along K; a group's scale maps its
largest-magnitude weight to -8 (llama.cpp's q4_0 rule, so all 16 levels are used) and every weight
rounds to the nearest level in [-8, 7]. Half of int8's weight bytes plus one fp16 per group (4.5
bits per weight at group 32, 4.25 at 64): batch-1 decode, which streams every weight once per
step, reads about half of what int8 reads.

With the C kernels (tandem.kernels.quant_linear), weights are packed for AVX512-VNNI and each
activation row is quantized to int8 on its own scale (W4A8, batch-invariant as int8's path); every
row count runs there. Without them, the torch path dequantizes a layer's weights per call and runs
a float matmul (W4A16): slower, same weights. The embedding table stays fp32 (a lookup reads one
row per token); the LM head is quantized unless `int4(lm_head=false)`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from tandem.kernels import int4_linear, pack_int4, quant_kernels_available
from tandem.kernels.quant_linear import Int4Packed
from tandem.optimize.precision import quantized_copy
from tandem.optimize.types import OptimizedModel

__all__ = ["Int4", "Int4Linear", "quantize_int4"]


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest 4-bit quantization: weight [N, K] float -> (q [N, K] int8 in [-8, 7],
    scales [N, ceil(K / group_size)] float16), weight ~= q * scale of its group."""
    n, k = weight.shape
    k_pad = -(-k // group_size) * group_size
    w = F.pad(weight.float(), (0, k_pad - k)).view(n, -1, group_size)
    # The group's largest-magnitude weight, with its sign, maps to -8.
    at = w.abs().argmax(dim=-1, keepdim=True)
    scales = (w.gather(-1, at) / -8.0).to(torch.float16)  # quantize with the scale as stored
    s = scales.float()
    safe = torch.where(s == 0, torch.ones_like(s), s)
    q = torch.where(s == 0, 0.0, torch.round(w / safe)).clamp_(-8, 7).to(torch.int8)
    return q.view(n, k_pad)[:, :k].contiguous(), scales.squeeze(-1)


class Int4Linear(nn.Module):
    def __init__(self, linear: nn.Linear, group_size: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group_size = group_size
        q, scales = quantize_int4(linear.weight.detach(), group_size)
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.kernel = quant_kernels_available()
        self.packed: Int4Packed | None = None
        if self.kernel:
            self.packed = pack_int4(q, scales, group_size)
            self.weight_bytes = self.packed.nbytes
        else:
            # Torch path: nibbles would need unpacking on every call anyway; keep q as int8.
            self.q, self.scales = q, scales
            self.weight_bytes = q.numel() // 2 + scales.numel() * 2
        if self.bias is not None:
            self.weight_bytes += self.bias.numel() * 4

    def dequantized(self) -> torch.Tensor:
        """The weights as the model computes with them, [N, K] float32 (torch path only)."""
        n, k = self.q.shape
        k_pad = self.scales.shape[1] * self.group_size
        w = F.pad(self.q.float(), (0, k_pad - k)).view(n, -1, self.group_size) * self.scales.float()[..., None]
        return w.view(n, k_pad)[:, :k]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.dtype != torch.float32 or (self.kernel and flat.stride(1) != 1):
            flat = flat.float().contiguous()
        if self.kernel:
            out = int4_linear(flat, self.packed, self.bias)
        else:
            out = F.linear(flat, self.dequantized(), self.bias)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def kernel_linear(self) -> tuple[Int4Packed, torch.Tensor | None] | None:
        """The packed weights the fused decoder computes with (tandem.kernels.KernelLinear)."""
        return (self.packed, self.bias) if self.kernel else None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 group={self.group_size}"


@dataclass(frozen=True)
class Int4:
    group_size: int = 32
    lm_head: bool = True
    name: str = "int4"
    version: str = "1.0"
    description: str = "int4 group-wise weights (round to nearest, fp16 scale per group), int8 dynamic activations"

    def __post_init__(self) -> None:
        if not isinstance(self.group_size, int) or self.group_size < 8 or self.group_size % 8:
            raise ValueError(f"int4 group_size must be a positive multiple of 8, got {self.group_size!r}")

    def with_params(self, **params) -> Int4:
        unknown = set(params) - {"group_size", "lm_head"}
        if unknown:
            raise TypeError(f"unexpected parameter(s) {', '.join(sorted(unknown))}; int4 takes group_size, lm_head")
        try:
            return replace(self, **params)
        except ValueError as exc:  # the registry reports TypeErrors as bad recipe parameters
            raise TypeError(str(exc)) from None

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        return quantized_copy(model, self.lm_head, lambda linear: Int4Linear(linear, self.group_size))
