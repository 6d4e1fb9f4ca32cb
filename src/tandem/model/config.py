"""ModelConfig: the fields of a Hugging Face config.json that tandem's forward pass needs.

Parsed strictly: a missing or ill-typed field is an error naming it, so a bad checkpoint fails at
load time with a message instead of deep inside a matmul. Sizes are bounded (`HARD_LIMITS`, far
above any released model) before anything is computed from them, and checked against the
checkpoint's own tensor shapes (tandem.model.checkpoint) before anything is allocated.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.model.errors import ModelLoadError
from tandem.model.files import model_file

__all__ = ["HARD_LIMITS", "ModelConfig", "SUPPORTED_ARCHITECTURES", "load_config"]

# The largest value each size may take (released models stay far below: vocabularies ~256k, hidden
# sizes ~16k, ~126 layers, ~10M positions). A config over one is refused before any arithmetic.
HARD_LIMITS: dict[str, int] = {
    "vocab_size": 1 << 21,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 19,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 1024,
    "max_position_embeddings": 1 << 24,
    "sliding_window": 1 << 24,
}

# Architecture name -> whether q/k/v projections carry a bias by default (Qwen2 does).
SUPPORTED_ARCHITECTURES: dict[str, bool] = {
    "LlamaForCausalLM": False,
    "MistralForCausalLM": False,
    "Qwen2ForCausalLM": True,
}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    hidden_act: str = "silu"
    torch_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        return self.num_hidden_layers * per_layer + v * h * (1 if self.tie_word_embeddings else 2) + h

    @property
    def kv_bytes_per_token_per_element(self) -> int:
        """K and V elements stored per token across all layers (multiply by the dtype size)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim


def _require(raw: dict[str, Any], name: str, kind: type, where: str) -> Any:
    if name not in raw:
        raise ModelLoadError(f"{where}: missing required field '{name}'")
    value = raw[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ModelLoadError(f"{where}: field '{name}' must be {kind.__name__}, got {value!r}")
    if kind is float and not math.isfinite(value):
        raise ModelLoadError(f"{where}: field '{name}' must be a finite number, got {value!r}")
    if kind in (int, float) and value <= 0:
        raise ModelLoadError(f"{where}: field '{name}' must be positive, got {value!r}")
    limit = HARD_LIMITS.get(name)
    if limit is not None and value > limit:
        raise ModelLoadError(f"{where}: field '{name}' = {value} is over the limit of {limit}")
    return value


def _factor(scaling: dict[str, Any], key: str, where: str, kind: str) -> float:
    value = scaling.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ModelLoadError(f"{where}: field 'rope_scaling.{key}' is required for {kind} rope")
    if not (math.isfinite(value) and 0 < value <= HARD_LIMITS["max_position_embeddings"]):
        raise ModelLoadError(f"{where}: field 'rope_scaling.{key}' must be a positive finite number, got {value!r}")
    return float(value)


def _optional(raw: dict[str, Any], name: str, kind: type, default: Any, where: str) -> Any:
    if raw.get(name) is None:
        return default
    return _require(raw, name, kind, where)


def _rope_scaling(raw: dict[str, Any], where: str) -> dict[str, Any] | None:
    # transformers 4 writes `rope_scaling`; transformers 5 writes `rope_parameters` (theta included).
    key = "rope_parameters" if raw.get("rope_parameters") is not None else "rope_scaling"
    scaling = raw.get(key)
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ModelLoadError(f"{where}: field '{key}' must be an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    if kind == "llama3":
        keep = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        out = {k: _factor(scaling, k, where, "llama3") for k in keep}
        if out["high_freq_factor"] <= out["low_freq_factor"]:  # the ramp between them divides by their difference
            raise ModelLoadError(f"{where}: field 'rope_scaling.high_freq_factor' must be above low_freq_factor")
        return {"rope_type": "llama3", **out}
    if kind == "linear":
        return {"rope_type": "linear", "factor": _factor(scaling, "factor", where, "linear")}
    raise ModelLoadError(
        f"{where}: field 'rope_scaling.rope_type' = {kind!r} is not supported (supported: default, linear, llama3)"
    )


def config_from_dict(raw: dict[str, Any], where: str = "config.json") -> ModelConfig:
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise ModelLoadError(f"{where}: field 'architectures' must be a non-empty list")
    arch = archs[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{where}: field 'architectures' = {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    hidden = _require(raw, "hidden_size", int, where)
    heads = _require(raw, "num_attention_heads", int, where)
    kv_heads = _optional(raw, "num_key_value_heads", int, heads, where)
    if heads % kv_heads:
        raise ModelLoadError(
            f"{where}: field 'num_key_value_heads' ({kv_heads}) must divide num_attention_heads ({heads})"
        )
    head_dim = _optional(raw, "head_dim", int, None, where)
    if head_dim is None:
        if hidden % heads:
            raise ModelLoadError(f"{where}: hidden_size ({hidden}) is not divisible by num_attention_heads")
        head_dim = hidden // heads
        if head_dim > HARD_LIMITS["head_dim"]:
            raise ModelLoadError(f"{where}: hidden_size / num_attention_heads = {head_dim} is over the head_dim limit")
    if head_dim % 2:
        raise ModelLoadError(f"{where}: field 'head_dim' must be even for rotary embeddings, got {head_dim}")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(f"{where}: field 'hidden_act' = {act!r} is not supported (supported: silu)")
    sliding = raw.get("sliding_window")
    if arch == "Qwen2ForCausalLM" and not raw.get("use_sliding_window", False):
        sliding = None
    if sliding is not None:
        sliding = _require(raw, "sliding_window", int, where)
    vocab = _require(raw, "vocab_size", int, where)
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in eos_ids):
        raise ModelLoadError(f"{where}: field 'eos_token_id' must be token ids below vocab_size, got {eos!r}")
    attention_bias = bool(raw.get("attention_bias", False))
    config = ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_require(raw, "intermediate_size", int, where),
        num_hidden_layers=_require(raw, "num_hidden_layers", int, where),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=_optional(raw, "max_position_embeddings", int, 2048, where),
        rms_norm_eps=_optional(raw, "rms_norm_eps", float, 1e-6, where),
        rope_theta=_optional(
            raw, "rope_theta", float, (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0), where
        ),
        rope_scaling=_rope_scaling(raw, where),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=SUPPORTED_ARCHITECTURES[arch] or attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        sliding_window=sliding,
        torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        bos_token_id=raw.get("bos_token_id") if isinstance(raw.get("bos_token_id"), int) else None,
        eos_token_ids=eos_ids,
    )
    if not math.isfinite(config.rope_theta):
        raise ModelLoadError(f"{where}: field 'rope_theta' must be finite")
    return config


def load_config(model_dir: Path) -> ModelConfig:
    path = model_file(Path(model_dir), "config.json")
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing (a model directory needs config.json)")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: must hold a JSON object")
    return config_from_dict(raw, str(path))
