"""Reading Hugging Face safetensors checkpoints (single file or sharded index) into a Transformer.

Safetensors only: pickle checkpoints can run arbitrary code when loaded, so they are refused.
Every failure names the file, and the tensor or field, at fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from tandem.model.config import ModelConfig
from tandem.model.errors import ModelLoadError
from tandem.model.files import model_file
from tandem.model.transformer import Transformer

__all__ = ["checkpoint_files", "load_weights"]

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, from model.safetensors or its sharded index."""
    model_dir = Path(model_dir)
    single = model_file(model_dir, "model.safetensors")
    index = model_file(model_dir, "model.safetensors.index.json")
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"{index}: not a valid safetensors index ({exc!r})") from None
        if not all(isinstance(s, str) and s for s in shards):
            raise ModelLoadError(f"{index}: shard names must be file names")
        paths = [model_file(model_dir, s) for s in shards]  # a shard named '../x' is refused here
        missing = [s for s, p in zip(shards, paths, strict=True) if not p.is_file()]
        if missing:
            raise ModelLoadError(f"{index}: shard file(s) missing: {', '.join(missing)}")
        return paths
    pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES) if model_dir.is_dir() else []
    if pickles:
        raise ModelLoadError(
            f"{model_dir}: only pickle checkpoints found ({', '.join(pickles)}); tandem loads safetensors only, "
            "because unpickling can run arbitrary code. Convert with "
            "`transformers` (model.save_pretrained(dir, safe_serialization=True))."
        )
    raise ModelLoadError(f"{single}: missing (no model.safetensors or model.safetensors.index.json)")


def _iter_tensors(files: list[Path]) -> Iterator[tuple[str, Path, torch.Tensor]]:
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    yield name, path, handle.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
            raise ModelLoadError(f"{path}: corrupt or truncated safetensors file ({exc})") from None


def _target_name(hf_name: str) -> tuple[str, int | None]:
    """Map a HF tensor name to (tandem parameter name, part index within a fused projection)."""
    name = hf_name.removeprefix("model.")
    for i, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        if f"self_attn.{proj}." in name:
            return name.replace(f"self_attn.{proj}.", "self_attn.qkv_proj."), i
    for i, proj in enumerate(("gate_proj", "up_proj")):
        if f"mlp.{proj}." in name:
            return name.replace(f"mlp.{proj}.", "mlp.gate_up_proj."), i
    return name, None


def load_weights(model: Transformer, files: list[Path]) -> None:
    """Copy checkpoint tensors into `model` (cast to its dtype), checking names and shapes."""
    config: ModelConfig = model.config
    params = dict(model.named_parameters(remove_duplicate=False))
    q_dim = config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim
    fused_rows = {"qkv_proj": (0, q_dim, q_dim + kv_dim, q_dim + 2 * kv_dim), "gate_up_proj": None}
    inter = config.intermediate_size
    filled: set[str] = set()
    with torch.no_grad():
        for hf_name, path, tensor in _iter_tensors(files):
            name, part = _target_name(hf_name)
            if name not in params:
                if "rotary_emb" in name:
                    continue  # some exports store inv_freq; tandem recomputes it
                raise ModelLoadError(f"{path}: unexpected tensor '{hf_name}' for {config.architecture}")
            target = params[name]
            if part is None:
                view = target
            elif "qkv_proj" in name:
                bounds = fused_rows["qkv_proj"]
                view = target[bounds[part] : bounds[part + 1]]
            else:
                view = target[part * inter : (part + 1) * inter]
            if tuple(tensor.shape) != tuple(view.shape):
                raise ModelLoadError(
                    f"{path}: tensor '{hf_name}' has shape {list(tensor.shape)}, config.json implies {list(view.shape)}"
                )
            view.copy_(tensor.to(view.dtype))
            filled.add(f"{name}#{part}")
    expected = set()
    for name, _ in model.named_parameters():
        if "qkv_proj" in name:
            expected |= {f"{name}#{i}" for i in range(3)}
        elif "gate_up_proj" in name:
            expected |= {f"{name}#{i}" for i in range(2)}
        else:
            expected.add(f"{name}#None")
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight#None")
        if "lm_head.weight#None" in filled:
            filled.discard("lm_head.weight#None")
    missing = sorted(expected - filled)
    if missing:
        shown = ", ".join(m.split("#")[0] for m in missing[:5])
        raise ModelLoadError(f"{files[0].parent}: checkpoint is missing tensor(s): {shown}")
