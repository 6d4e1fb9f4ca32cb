"""What one replica of a variant needs in memory, filled into the deployment before it starts.

From its measured Profile when it has one (weights + its whole KV budget + the runtime around them,
tandem.schedule.variant.replica_memory_bytes); else computed from the model's `config.json` and the
recipe's bits by tandem.schedule.memory.estimate_replica_memory (the one estimator), at the dtype
and KV budget the replica's own flags give it (`--dtype`, default float32; `--kv-cache-tokens`,
which the engine preallocates), plus the bundled draft's weights and KV with `speculative`.

An external engine (vLLM, SGLang) gives its own (`resources.memory`), or reserves nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tandem.data.bundled import bundled_draft_dir, bundled_model_dir
from tandem.schedule.memory import ModelShape, estimate_replica_memory
from tandem.schedule.variant import DEFAULT_KV_CACHE_TOKENS

__all__ = ["estimated_replica_bytes", "fill_replica_memory", "model_shape", "recipe_parts", "replica_bytes_from_args"]

_DTYPE_BITS = {"float32": 32, "bfloat16": 16, "float16": 16}


def recipe_parts(recipe: str | None) -> set[str]:
    """The optimizer names in a recipe ("int8+speculative(k=4)" -> {"int8", "speculative"})."""
    return {re.split(r"[(@]", part, maxsplit=1)[0].strip() for part in (recipe or "").split("+") if part.strip()}


def model_shape(model_dir: str | Path) -> ModelShape | None:
    """The shape in `model_dir`/config.json; None where there is no readable one (a Hugging Face id)."""
    try:
        return ModelShape.from_config(json.loads((Path(model_dir) / "config.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def estimated_replica_bytes(
    model: str | None, recipe: str | None, *, dtype: str = "float32", kv_cache_tokens: int | None = None
) -> int | None:
    """Bytes one tandem replica of `model` (None: the bundled model) with `recipe` holds; None where
    the model's config cannot be read (the variant then reserves what its Profile says, or nothing)."""
    shape = model_shape(model if model is not None else bundled_model_dir())
    if shape is None:
        return None
    bits = _DTYPE_BITS.get(dtype, 32)
    tokens = kv_cache_tokens or DEFAULT_KV_CACHE_TOKENS
    total = estimate_replica_memory(shape, recipe, tokens, base_bits=bits).total_bytes
    draft = model_shape(bundled_draft_dir()) if "speculative" in recipe_parts(recipe) else None
    if draft is not None:  # the draft's weights and its own KV cache ride along (at the replica's dtype)
        total += estimate_replica_memory(draft, None, tokens, base_bits=bits, runtime_bytes=0).total_bytes
    return total


def _flag(args: tuple[str, ...] | list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` in a replica's command line (the last one wins)."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def replica_bytes_from_args(model: str | None, recipe: str | None, args: tuple[str, ...] | list[str]) -> int | None:
    """`estimated_replica_bytes` with the dtype and KV budget the replica's own flags give it."""
    tokens = _flag(args, "--kv-cache-tokens")
    try:
        kv_tokens = int(tokens) if tokens is not None else None
    except ValueError:
        kv_tokens = None
    return estimated_replica_bytes(model, recipe, dtype=_flag(args, "--dtype") or "float32", kv_cache_tokens=kv_tokens)


def fill_replica_memory(out: dict[str, Any]) -> None:
    """Give every tandem variant of one model's mapping that has neither `resources.memory` nor a
    Profile its estimated memory (in place), so each replica's need is known before it starts."""
    for variant in out.get("variants") or []:
        if not isinstance(variant, dict) or variant.get("engine", "tandem") != "tandem":
            continue
        resources = variant.get("resources") or {}
        if resources.get("memory") is not None or variant.get("profile") is not None:
            continue  # given, or from its Profile (tandem.schedule.variant.Variant.replica_memory)
        model = variant.get("model", out.get("model"))
        memory = replica_bytes_from_args(model, variant.get("recipe"), [str(a) for a in variant.get("args") or []])
        if memory is not None:
            variant["resources"] = {**resources, "memory": memory}
