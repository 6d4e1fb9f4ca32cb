"""The checks every speculative optimizer makes of its parameters and of the recipe it joins, in one
place so their words stay the same: ValueError naming the optimizer and the parameter."""

from __future__ import annotations

from typing import Any

from tandem.optimize.types import OptimizedModel

__all__ = ["integer_in", "no_speculator_yet"]


def integer_in(who: str, name: str, value: Any, low: int, high: int | None = None) -> None:
    """`value` must be an integer in [low, high] (no upper bound when `high` is None)."""
    if not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{who}: {name} must be an integer {bound}, got {value!r}")


def no_speculator_yet(who: str, model: OptimizedModel) -> None:
    """A recipe takes one speculative optimizer."""
    if model.speculator is not None:
        raise ValueError(f"{who}: the recipe already has a speculator; use one speculative optimizer")
