"""`int8`: 8-bit weights with per-output-channel scales on the transformer's Linear layers.

Runs through fbgemm's dynamic W8A8 kernel: each activation row is quantized to 8 bits on the fly
(on its own scale: results do not depend on the rest of the batch), multiplied against the int8
weights with int32 accumulation, and rescaled to float. Decode reads a quarter of the fp32 weight
bytes, which is what a memory-bound decode step is paid by.

What stays in higher precision, and why:
- the embedding table: a lookup reads one row per token, so quantizing it saves no time (a tied
  LM head is untied first, so the table stays exact);
- RMSNorm weights and rotary tables: tiny, and they set the scale of every activation.
The LM head is quantized too: with a 32k vocabulary it is a fifth of a 134M model's bytes, and on
the bundled model it moved held-out perplexity by 0.1% with 97.5% greedy top-1 agreement
(tests/optimize/test_bundled_recipes.py). `int8(lm_head=false)` keeps it fp32.

Two paths, one result: prompts (more than QUANT_MAX_ROWS rows) go through fbgemm's packed
weights; decode batches (1-16 rows) through tandem's VNNI kernel (tandem.kernels.quant_linear),
which gives bit for bit fbgemm's output and streams each weight once for all rows, without
fbgemm's per-call packing. It keeps its own packed copy of the int8 weights, so quantized layers
hold 2 bytes per parameter instead of 1 (as much as bf16, half of fp32);
`int8(small_batch_kernel=false)` drops the copy and the kernel, for placements bound by memory
rather than latency.

On a CPU without AVX512-VNNI (an AVX2-only AMD EPYC, say) fbgemm sums pairs of u8 x s8 products
in int16, which saturates for 255 x 127 x 2 (`fbgemm_saturates` finds out once per process). There
the weights take 7 bits ([-63, 63] per channel) and the activations keep 8: a pair is at most
255 x 63 x 2 = 32130, exact. On the bundled model that kept 96.2% greedy top-1 agreement with fp32
(perplexity +0.6%), where 7-bit activations (PyTorch's `reduce_range`) kept 92.7% (+1.1%).
tandem's kernel has an AVX2 path for such CPUs with the same int16 pair sums, so it serves decode
batches there too, on the same 7-bit weights (it refuses wider ones).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from tandem.kernels import (
    QUANT_MAX_ROWS,
    int8_kernel_max_weight,
    int8_linear,
    kernels_available,
    pack_int8,
    quant_kernels_available,
    rows_to_unit,
    scale_rows,
)
from tandem.kernels.quant_linear import Int8Packed
from tandem.optimize.precision import quantized_copy
from tandem.optimize.types import OptimizedModel

__all__ = ["ActivationScratch", "Int8Linear", "Int8", "fbgemm_saturates", "weight_levels"]


@functools.lru_cache(maxsize=1)
def fbgemm_saturates() -> bool:
    """Whether fbgemm's u8 x s8 products saturate on this CPU.

    With AVX512-VNNI fbgemm multiplies u8 activations by s8 weights into int32 (vpdpbusd): exact.
    Without it (AVX2, or AVX-512 without VNNI) it sums pairs of products into int16 (vpmaddubsw),
    which saturates past 32767: 255 x 127 x 2 does not fit, and random layers' outputs came out
    wrong by a fifth of their range. Measured once per process on a layer that saturates exactly
    there (every weight 127, every activation 255), rather than guessed from CPU flags."""
    k = 64
    _, packed = prepack(torch.ones(16, k), torch.full((16,), 1 / 127, dtype=torch.double))
    x = torch.ones(2, k)
    x[0].zero_()
    x[0, 0], x[0, -1] = 1.0, -1.0  # the range row: [-1, 1], so a 1.0 quantizes to 255
    out = torch.ops.quantized.linear_dynamic(x, packed, reduce_range=False)[1]
    return not bool(torch.allclose(out, torch.full_like(out, float(k)), rtol=0.02))


def prepack(weight: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """fbgemm's int8 weights, per output channel with zero points 0, and its packed copy of them."""
    zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch marks quantized tensors deprecated; fbgemm still ships
        warnings.simplefilter("ignore")
        qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        return qweight, torch.ops.quantized.linear_prepack(qweight, None)


def weight_levels() -> float:
    """The largest weight magnitude quantized: 127, or 63 where fbgemm's products would saturate."""
    return 63.0 if fbgemm_saturates() else 127.0


class ActivationScratch:
    """Reused input buffers for Int8Linear: row 0 is the constant range row, the scaled
    activations go below it. One per model (its layers run one after another), so each forward
    writes its rows in place instead of allocating and concatenating."""

    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}

    def rows(self, num_rows: int, width: int) -> torch.Tensor:
        """[num_rows + 1, width]: the range row, then num_rows rows to fill."""
        buf = self._buffers.get(width)
        if buf is None or buf.shape[0] < num_rows + 1:
            # A normal tensor even when first made under inference mode, so later calls in any mode
            # may write into it.
            with torch.inference_mode(False):
                buf = torch.empty(max(num_rows + 1, 64, 0 if buf is None else 2 * buf.shape[0]), width)
                buf[0].zero_()
                buf[0, 0], buf[0, -1] = 1.0, -1.0  # pins fbgemm's dynamic range to [-1, 1]
            self._buffers[width] = buf
        return buf[: num_rows + 1]


class Int8Linear(nn.Module):
    def __init__(
        self, linear: nn.Linear, scratch: ActivationScratch | None = None, small_batch_kernel: bool = True
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / weight_levels()).clamp_min(1e-12).double()
        qweight, self._packed = prepack(weight, scales)
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.scratch = scratch or ActivationScratch()
        self.fused = kernels_available()  # one C pass each side of the matmul instead of four torch ops
        self.weight_bytes = self.out_features * self.in_features + self.out_features * 8
        if self.bias is not None:
            self.weight_bytes += self.bias.numel() * 4
        # Decode batches (1-16 rows): a VNNI kernel that gives exactly fbgemm's numbers, on its own
        # packed copy of the int8 weights (fbgemm's packed copy serves prompts).
        self.gemv = (
            small_batch_kernel
            and self.fused
            and quant_kernels_available()
            and weight_levels() <= int8_kernel_max_weight()
        )
        self.packed: Int8Packed | None = None
        if self.gemv:
            self.packed = pack_int8(qweight.int_repr(), qweight.q_per_channel_scales().float())
            self.weight_bytes += self.packed.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fbgemm quantizes activations with one range per call, so a row's result would depend on
        # the other rows in the batch (continuous batching would change greedy output). Each row is
        # scaled to max |x| = 1 and a fixed row spans [-1, 1]: every row is quantized on the same
        # grid whatever the batch, the int32 accumulation is exact, and the row's scale is
        # multiplied back afterwards (the layer is linear). Batch-invariant, per-row precision.
        flat = x.reshape(-1, self.in_features)
        if flat.dtype != torch.float32:
            flat = flat.float()
        if self.gemv and 0 < flat.shape[0] <= QUANT_MAX_ROWS and flat.stride(1) == 1:
            out = int8_linear(flat, self.packed, self.bias)
        elif self.fused:
            rows = self.scratch.rows(flat.shape[0], self.in_features)
            scale = rows_to_unit(flat, rows[1:])
            out = torch.ops.quantized.linear_dynamic(rows, self._packed, reduce_range=False)[1:]
            scale_rows(out, scale, self.bias)
        else:
            rows = self.scratch.rows(flat.shape[0], self.in_features)
            scale = flat.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30)  # (vector_norm(inf): 10x slower)
            # Times the reciprocal, as the C pass does, so both paths quantize the same floats: a row's
            # largest negative value, -1 exactly, lands on a rounding tie of fbgemm's grid (-127.5 +
            # 128 = 0.5), where one ulp decides the level.
            torch.mul(flat, scale.reciprocal(), out=rows[1:])
            out = torch.ops.quantized.linear_dynamic(rows, self._packed, reduce_range=False)[1:]
            out.mul_(scale)  # fbgemm's fresh output: scaled in place, no extra copies
            if self.bias is not None:
                out.add_(self.bias)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def kernel_linear(self) -> tuple[Int8Packed, torch.Tensor | None] | None:
        """The packed weights the fused decoder computes with (tandem.kernels.KernelLinear)."""
        return (self.packed, self.bias) if self.gemv else None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


@dataclass(frozen=True)
class Int8:
    lm_head: bool = True
    small_batch_kernel: bool = True
    name: str = "int8"
    version: str = "1.0"
    description: str = "int8 per-channel weights, dynamic int8 activations (fbgemm W8A8), LM head included"

    def with_params(self, **params) -> Int8:
        unknown = set(params) - {"lm_head", "small_batch_kernel"}
        if unknown:
            raise TypeError(
                f"unexpected parameter(s) {', '.join(sorted(unknown))}; int8 takes lm_head, small_batch_kernel"
            )
        return replace(self, **params)

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise RuntimeError("int8: this torch build has no fbgemm quantized kernels")
        scratch = ActivationScratch()  # one per model: its layers run one after another
        return quantized_copy(model, self.lm_head, lambda linear: Int8Linear(linear, scratch, self.small_batch_kernel))
