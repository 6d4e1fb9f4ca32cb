"""save_pretrained: a tandem Transformer -> a Hugging Face model directory (config.json, safetensors).

The inverse of tandem.model.loader: fused projections are split back into HF's tensor names
(qkv_proj -> q_proj/k_proj/v_proj, gate_up_proj -> gate_proj/up_proj), so `load_model(out)` and
transformers' `AutoModelForCausalLM.from_pretrained(out)` both read the result. No transformers
import: exporting is part of building the bundled models, which must not need the test oracle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tandem.model.config import ModelConfig
from tandem.model.transformer import Transformer

__all__ = ["save_pretrained", "hf_config_dict", "hf_state_dict", "MODEL_TYPES"]

MODEL_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _check_exportable(config: ModelConfig) -> None:
    """Refuse configurations that config.json of the architecture cannot express."""
    arch = config.architecture
    if arch not in MODEL_TYPES:
        raise ValueError(f"cannot export architecture {arch!r} (supported: {', '.join(MODEL_TYPES)})")
    if arch == "Qwen2ForCausalLM":
        if not config.qkv_bias or config.o_bias or config.mlp_bias:
            raise ValueError("Qwen2 checkpoints always have q/k/v biases and no o_proj/MLP biases")
    elif config.qkv_bias != config.o_bias:
        # Llama's and Mistral's `attention_bias` switches q/k/v and o_proj biases together.
        raise ValueError(f"{arch}: q/k/v and o_proj biases must be both on or both off")
    if arch == "MistralForCausalLM" and config.mlp_bias:
        raise ValueError("Mistral has no mlp_bias option")
    if arch == "LlamaForCausalLM" and config.sliding_window is not None:
        raise ValueError("Llama has no sliding window; export it as MistralForCausalLM")


def _rope_scaling(config: ModelConfig) -> dict[str, Any] | None:
    if not config.rope_scaling:
        return None
    scaling = dict(config.rope_scaling)
    if "original_max_position_embeddings" in scaling:  # a length: transformers insists on an int
        scaling["original_max_position_embeddings"] = int(scaling["original_max_position_embeddings"])
    return scaling


def hf_config_dict(config: ModelConfig, dtype: torch.dtype, pad_token_id: int | None = None) -> dict[str, Any]:
    """config.json's contents, every field spelled out (nothing left to a library's defaults)."""
    _check_exportable(config)
    eos: int | list[int] | None = list(config.eos_token_ids) or None
    if isinstance(eos, list) and len(eos) == 1:
        eos = eos[0]
    raw: dict[str, Any] = {
        "architectures": [config.architecture],
        "model_type": MODEL_TYPES[config.architecture],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        # Legacy spelling (rope_theta + rope_scaling): transformers 4 reads it and 5 converts it.
        "rope_theta": config.rope_theta,
        "rope_scaling": _rope_scaling(config),
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": pad_token_id,
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": DTYPE_NAMES[dtype],
    }
    if config.architecture == "Qwen2ForCausalLM":
        raw["use_sliding_window"] = config.sliding_window is not None
        raw["sliding_window"] = config.sliding_window
        raw["max_window_layers"] = config.num_hidden_layers
    else:
        raw["attention_bias"] = config.qkv_bias
        if config.architecture == "MistralForCausalLM":
            raw["sliding_window"] = config.sliding_window
        else:
            raw["mlp_bias"] = config.mlp_bias
            raw["pretraining_tp"] = 1
    return raw


def _split_name(name: str, config: ModelConfig) -> list[tuple[str, slice]]:
    """tandem parameter name -> [(HF tensor name, rows of the tandem tensor it holds)]."""
    q_dim = config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim
    inter = config.intermediate_size
    hf = name if name == "lm_head.weight" else f"model.{name}"
    if ".qkv_proj." in name:
        bounds = (0, q_dim, q_dim + kv_dim, q_dim + 2 * kv_dim)
        parts = ("q_proj", "k_proj", "v_proj")
        return [(hf.replace("qkv_proj", p), slice(bounds[i], bounds[i + 1])) for i, p in enumerate(parts)]
    if ".gate_up_proj." in name:
        parts = ("gate_proj", "up_proj")
        return [(hf.replace("gate_up_proj", p), slice(i * inter, (i + 1) * inter)) for i, p in enumerate(parts)]
    return [(hf, slice(None))]


def hf_state_dict(module: Transformer, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The weights under HF tensor names, cast to `dtype`, each a contiguous tensor of its own."""
    config = module.config
    out: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters():  # tied lm_head is listed once, as embed_tokens
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        for hf_name, rows in _split_name(name, config):
            out[hf_name] = param.detach()[rows].to(dtype).contiguous().clone()
    return out


def save_pretrained(
    module: Transformer,
    out_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    pad_token_id: int | None = None,
) -> Path:
    """Write config.json, model.safetensors and generation_config.json for `module` into out_dir."""
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype {dtype} is not supported (supported: {', '.join(DTYPE_NAMES.values())})")
    config = module.config
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = hf_config_dict(config, dtype, pad_token_id)
    save_file(hf_state_dict(module, dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    generation = {
        "bos_token_id": raw["bos_token_id"],
        "eos_token_id": raw["eos_token_id"],
        "pad_token_id": pad_token_id,
        "do_sample": False,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out
