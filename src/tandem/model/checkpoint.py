"""A checkpoint checked against its config before anything is allocated: headers, shapes, sizes.

A safetensors file starts with an 8-byte length and a JSON header naming every tensor's dtype,
shape and byte range. `check_checkpoint(config, files)` reads only those headers (milliseconds,
whatever the model's size) and refuses, with ModelLoadError naming the config field or the
tensor at fault:
- a header that is not one (too long, not JSON, a byte range outside the file or of the wrong
  size for its shape and dtype): a truncated or corrupt file;
- a config that promises more (or other) than the files hold: `num_hidden_layers` against the
  layers present, and every tensor the config implies against its shape in the header, the
  mismatching dimension traced back to its field (`hidden_size`, `vocab_size`, ...).
So `hidden_size: 1000000000` fails here in well under a second, not after gigabytes of allocation.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from tandem.model.config import ModelConfig
from tandem.model.errors import ModelLoadError

__all__ = ["TensorInfo", "check_checkpoint", "expected_tensors", "read_header"]

MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
DTYPE_BYTES |= {"F8_E4M3": 1, "F8_E5M2": 1}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path


Dim = tuple[int, str]  # a dimension and the config field(s) it comes from


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a safetensors file declares, each checked to lie within the file with a consistent size."""

    def corrupt(detail: str) -> ModelLoadError:
        return ModelLoadError(f"{path}: corrupt or truncated safetensors file ({detail})")

    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise corrupt("shorter than its header")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise corrupt(f"a header of {length} bytes in a file of {size}")
            raw = json.loads(handle.read(length))
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise corrupt(f"the header is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise corrupt("the header is not a JSON object")
    data_bytes = size - 8 - length
    tensors = {}
    for name, entry in raw.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise corrupt(f"tensor '{name}': a malformed header entry") from None
        if dtype not in DTYPE_BYTES:
            raise ModelLoadError(f"{path}: tensor '{name}' has the unsupported dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise corrupt(f"tensor '{name}': shape {shape!r}")
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= data_bytes):
            raise corrupt(f"tensor '{name}': its bytes [{start}, {end}) lie outside the file's {data_bytes}")
        if end - start != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise corrupt(f"tensor '{name}': {end - start} bytes cannot hold a {dtype} tensor of shape {shape}")
        tensors[name] = TensorInfo(name, dtype, tuple(shape), path)
    return tensors


def expected_tensors(config: ModelConfig) -> dict[str, tuple[Dim, ...]]:
    """Every tensor `config` implies (Hugging Face names), each dimension labelled with its config field."""
    h: Dim = (config.hidden_size, "hidden_size")
    v: Dim = (config.vocab_size, "vocab_size")
    i: Dim = (config.intermediate_size, "intermediate_size")
    q: Dim = (config.num_attention_heads * config.head_dim, "num_attention_heads x head_dim")
    kv: Dim = (config.num_key_value_heads * config.head_dim, "num_key_value_heads x head_dim")
    out: dict[str, tuple[Dim, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (v, h)
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        out |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
        if config.qkv_bias:
            out |= {p + f"self_attn.{n}_proj.bias": (d,) for n, d in (("q", q), ("k", kv), ("v", kv))}
        if config.o_bias:
            out[p + "self_attn.o_proj.bias"] = (h,)
        if config.mlp_bias:
            out |= {p + "mlp.gate_proj.bias": (i,), p + "mlp.up_proj.bias": (i,), p + "mlp.down_proj.bias": (h,)}
    return out


def check_checkpoint(config: ModelConfig, files: list[Path], where: str = "config.json") -> dict[str, TensorInfo]:
    """Refuse a checkpoint that does not hold what `config` says (see the module docstring). Allocates nothing."""
    found: dict[str, TensorInfo] = {}
    for path in files:
        found |= read_header(path)
    layers = {int(m.group(1)) for name in found if (m := _LAYER.match(name))}
    held = max(layers) + 1 if layers else 0
    if held != config.num_hidden_layers:
        raise ModelLoadError(
            f"{where}: field 'num_hidden_layers' = {config.num_hidden_layers}, but the checkpoint holds {held} layers"
        )
    for name, dims in expected_tensors(config).items():
        info = found.get(name)
        if info is None:
            raise ModelLoadError(f"{files[0].parent}: checkpoint is missing tensor(s): {name} (config.json implies it)")
        implied = tuple(size for size, _ in dims)
        if info.shape != implied:
            field = next(
                (label for (size, label), actual in zip(dims, info.shape, strict=False) if size != actual),
                " / ".join(label for _, label in dims),
            )
            value = next((size for size, label in dims if label == field), "?")
            raise ModelLoadError(
                f"{where}: field '{field}' = {value} does not match the checkpoint: tensor '{name}' in "
                f"{info.file.name} has shape {list(info.shape)}, the config implies {list(implied)}"
            )
    return found
