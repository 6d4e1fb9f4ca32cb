"""What one replica of a variant needs in memory, known before it starts.

From its measured Profile when it has one (weights + its whole KV budget + the runtime around them,
tandem.schedule.variant.replica_memory_bytes); else computed from the model's `config.json` and the
recipe's precisions, torch-free:

- weights: every parameter at the replica's dtype (float32 unless `--dtype bfloat16`), the
  transformer's Linear weights at 1 byte (`int8`, plus an 8-byte scale and zero per output) or half
  a byte (`int4`) when the recipe quantizes them, and the bundled draft's own weights with `speculative`;
- KV: 2 x layers x KV heads x head dim elements per token at the KV dtype (`kv-bf16`: 2 bytes,
  else the replica's dtype), times the KV budget (`--kv-cache-tokens`, which the engine preallocates);
- runtime: REPLICA_RUNTIME_BYTES (Python, torch, the tokenizer, the server; measured).

An external engine (vLLM, SGLang) gives its own (`resources.memory`), or reserves nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.data.bundled import bundled_draft_dir, bundled_model_dir
from tandem.schedule.variant import DEFAULT_KV_CACHE_TOKENS, REPLICA_RUNTIME_BYTES

__all__ = [
    "ModelShape",
    "estimated_replica_bytes",
    "model_shape",
    "fill_replica_memory",
    "recipe_parts",
    "replica_bytes_from_args",
]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that memory depends on (from its config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool

    @property
    def linear_params(self) -> int:
        """Parameters in the layers' Linear weights (attention and MLP): what int8/int4 quantize."""
        attention = self.hidden_size * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.layers * (attention + mlp)

    @property
    def linear_outputs(self) -> int:
        """Output features of those Linears (each gets a scale and a zero point when quantized)."""
        return self.layers * (self.head_dim * (self.heads + 2 * self.kv_heads) + self.hidden_size
                              + 2 * self.intermediate_size + self.hidden_size)  # fmt: skip

    @property
    def other_params(self) -> int:
        """Embeddings, the LM head (unless tied) and the norms: kept at the replica's dtype."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return embeddings + (2 * self.layers + 1) * self.hidden_size

    @property
    def kv_elements_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim


def model_shape(model_dir: str | Path) -> ModelShape | None:
    """The shape in `model_dir`/config.json; None where there is no readable one (a Hugging Face id)."""
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        return ModelShape(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            layers=int(raw["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
        )
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def recipe_parts(recipe: str | None) -> set[str]:
    """The optimizer names in a recipe ("int8+speculative(k=4)" -> {"int8", "speculative"})."""
    return {re.split(r"[(@]", part, maxsplit=1)[0].strip() for part in (recipe or "").split("+") if part.strip()}


def _weights_and_kv(shape: ModelShape, parts: set[str], dtype_bytes: int, kv_tokens: int) -> int:
    linear = shape.linear_params * dtype_bytes
    if "int8" in parts:
        linear = shape.linear_params + shape.linear_outputs * 8
    elif "int4" in parts:
        linear = shape.linear_params // 2 + shape.linear_outputs * 2
    kv_bytes = 2 if "kv-bf16" in parts else dtype_bytes
    return linear + shape.other_params * dtype_bytes + shape.kv_elements_per_token * kv_bytes * kv_tokens


def estimated_replica_bytes(
    model: str | None,
    recipe: str | None,
    *,
    dtype: str = "float32",
    kv_cache_tokens: int | None = None,
) -> int | None:
    """Bytes one tandem replica of `model` (None: the bundled model) with `recipe` holds; None where
    the model's config cannot be read (the variant then reserves what its Profile says, or nothing)."""
    shape = model_shape(model if model is not None else bundled_model_dir())
    if shape is None:
        return None
    parts = recipe_parts(recipe)
    dtype_bytes = 2 if "bf16" in parts else _DTYPE_BYTES.get(dtype, 4)
    kv_tokens = kv_cache_tokens or DEFAULT_KV_CACHE_TOKENS
    total = _weights_and_kv(shape, parts, dtype_bytes, kv_tokens) + REPLICA_RUNTIME_BYTES
    if "speculative" in parts:  # the draft's weights and its own KV cache ride along
        draft = model_shape(bundled_draft_dir())
        if draft is not None:
            total += _weights_and_kv(draft, parts - {"int8", "int4"}, dtype_bytes, kv_tokens)
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
