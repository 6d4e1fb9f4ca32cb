"""The optimization layer's own types: what an optimizer takes and returns, and what the engine runs.

The model stays `Any` here: this module itself needs no torch. Third-party optimizers (the
`tandem.optimizers` entry-point group) implement `InferenceOptimizer`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

__all__ = ["InferenceOptimizer", "OptimizedModel"]


@dataclass(frozen=True)
class OptimizedModel:
    """What the engine runs: a (possibly transformed) model plus what the optimizers attached.

    `model` is the optimization layer's own model object (tandem.model.Model); it stays `Any` here so
    this module needs no torch. `speculator`, when set, proposes draft tokens that the engine
    verifies in its batched forward (draft-model or n-gram speculation). `kv_cache_dtype`, when
    set, is the dtype the engine stores keys and values in (a narrower cache: fewer bytes read per
    decode step, more sequences per byte).
    """

    model: Any
    recipe: str = "baseline"
    applied: tuple[tuple[str, str], ...] = ()  # (optimizer name, version) in the order applied
    speculator: Any | None = None
    notes: tuple[str, ...] = ()
    kv_cache_dtype: str | None = None  # e.g. "bfloat16"; None stores keys and values in the model's dtype

    def with_changes(self, **changes: Any) -> OptimizedModel:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return OptimizedModel(**values)


@runtime_checkable
class InferenceOptimizer(Protocol):
    """A named, versioned transform: OptimizedModel in, OptimizedModel out (so optimizers compose)."""

    name: str
    version: str
    description: str

    def optimize(self, model: OptimizedModel) -> OptimizedModel: ...
