"""`int8`: 8-bit weights with per-output-channel scales on the transformer's Linear layers.

Runs through fbgemm's dynamic W8A8 kernel: each activation row is quantized to 8 bits on the fly,
multiplied against the int8 weights with int32 accumulation, and rescaled to float. Decode reads a
quarter of the fp32 weight bytes, which is what a memory-bound decode step is paid by.

What stays in higher precision, and why:
- the embedding table: a lookup reads one row per token, so quantizing it saves no time (a tied
  LM head is untied first, so the table stays exact);
- RMSNorm weights and rotary tables: tiny, and they set the scale of every activation.
The LM head is quantized too: with a 32k vocabulary it is a fifth of a 134M model's bytes, and on
the bundled model it moved held-out perplexity by 0.1% with 97.5% greedy top-1 agreement
(tests/optimize/test_bundled_recipes.py). `int8(lm_head=false)` keeps it fp32.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, replace

import torch
from torch import nn

from tandem.contracts import OptimizedModel
from tandem.model.loader import Model
from tandem.optimize.precision import ensure_unpacked, with_dtype

__all__ = ["Int8Linear", "Int8", "quantize_linears"]


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch marks quantized tensors deprecated; fbgemm still ships
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            bias = None if linear.bias is None else linear.bias.detach().float()
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.weight_bytes = self.out_features * self.in_features + self.out_features * 8
        if bias is not None:
            self.weight_bytes += bias.numel() * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        out = torch.ops.quantized.linear_dynamic(x.float(), self._packed, reduce_range=False)
        return out if dtype == torch.float32 else out.to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_linears(module: nn.Module, include_lm_head: bool) -> int:
    """Replace nn.Linear layers (the LM head only if asked) by Int8Linear, in place."""
    count = 0
    for parent_name, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if type(child) is nn.Linear and (include_lm_head or full != "lm_head"):
                setattr(parent, name, Int8Linear(child))
                count += 1
    return count


@dataclass(frozen=True)
class Int8:
    lm_head: bool = True
    name: str = "int8"
    version: str = "1.0"
    description: str = "int8 per-channel weights, dynamic int8 activations (fbgemm W8A8), LM head included"

    def with_params(self, **params) -> Int8:
        unknown = set(params) - {"lm_head"}
        if unknown:
            raise TypeError(f"unexpected parameter(s) {', '.join(sorted(unknown))}; int8 takes lm_head")
        return replace(self, **params)

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise RuntimeError("int8: this torch build has no fbgemm quantized kernels")
        source: Model = with_dtype(model.model, torch.float32)  # quantize from fp32 weights
        ensure_unpacked(source)
        module = copy.deepcopy(source.module)
        if module.config.tie_word_embeddings and self.lm_head:
            module.lm_head = copy.deepcopy(module.lm_head)  # untie: the embedding stays fp32
        quantize_linears(module, self.lm_head)
        module.rope_cos, module.rope_sin = source.module.rope_cos, source.module.rope_sin
        return model.with_changes(model=replace(source, module=module))
