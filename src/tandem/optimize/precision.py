"""`baseline` (the model as loaded, in fp32) and `bf16` (weights and activations in bfloat16)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from tandem.model.loader import Model
from tandem.model.packed_linear import PackedLinear
from tandem.optimize.types import OptimizedModel

__all__ = ["Baseline", "BFloat16", "with_dtype", "quantized_copy"]


def ensure_unpacked(model: Model) -> None:
    if any(isinstance(m, PackedLinear) for m in model.module.modules()):
        raise ValueError(
            f"model {model.name!r} is already owned by an Engine (its weights are packed); "
            "apply optimizers to a freshly loaded model, before creating the Engine"
        )


def with_dtype(model: Model, dtype: torch.dtype) -> Model:
    """A copy of `model` whose weights are in `dtype` (the input model is left as it was)."""
    ensure_unpacked(model)
    if model.dtype == dtype:
        return model
    module = copy.deepcopy(model.module).to(dtype)
    module.rope_cos, module.rope_sin = model.module.rope_cos, model.module.rope_sin  # stay float32
    return replace(model, module=module)


def quantized_copy(model: OptimizedModel, lm_head: bool, make: Callable[[nn.Linear], nn.Module]) -> OptimizedModel:
    """A copy of the model, from fp32 weights, whose nn.Linear layers are replaced by make(linear)
    (the LM head too if lm_head; a tied head is untied first, so the embedding stays fp32)."""
    source: Model = with_dtype(model.model, torch.float32)
    ensure_unpacked(source)
    module = copy.deepcopy(source.module)
    if module.config.tie_word_embeddings and lm_head:
        module.lm_head = copy.deepcopy(module.lm_head)
    for parent_name, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if type(child) is nn.Linear and (lm_head or full != "lm_head"):
                setattr(parent, name, make(child))
    module.rope_cos, module.rope_sin = source.module.rope_cos, source.module.rope_sin
    return model.with_changes(model=replace(source, module=module))


@dataclass(frozen=True)
class Baseline:
    name: str = "baseline"
    version: str = "1.0"
    description: str = "the model as loaded, fp32 weights and activations (the reference)"

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        return model.with_changes(model=with_dtype(model.model, torch.float32))


@dataclass(frozen=True)
class BFloat16:
    name: str = "bf16"
    version: str = "1.0"
    description: str = "bfloat16 weights and activations (half the bytes per decode step; oneDNN bf16 kernels)"

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        return model.with_changes(model=with_dtype(model.model, torch.bfloat16))
