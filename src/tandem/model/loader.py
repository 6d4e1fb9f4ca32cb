"""load_model: a Hugging Face model directory -> a ready-to-run Model (weights, tokenizer, defaults).

Everything is checked before anything large is allocated: the config against hard limits, every
file against the model directory (no symlink out of it), and the checkpoint's tensor headers
against the config (tandem.model.checkpoint). Position tables are built for the context served
(`max_model_len`), not for the model's largest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tandem.model.checkpoint import check_checkpoint
from tandem.model.config import ModelConfig, load_config
from tandem.model.errors import ModelLoadError
from tandem.model.files import model_file
from tandem.model.hub import bundled_model_dir, resolve_model
from tandem.model.tokenizer import Tokenizer
from tandem.model.transformer import Transformer
from tandem.model.weights import checkpoint_files, load_weights

__all__ = ["Model", "load_model", "DTYPES", "DEFAULT_CONTEXT", "default_model_dir"]

DEFAULT_CONTEXT = 2048  # positions prepared when the caller does not say (the engine's default context cap)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


@dataclass
class Model:
    """A loaded model: what the engine runs and what optimizers transform."""

    name: str
    path: Path
    config: ModelConfig
    module: Transformer
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    generation_defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> torch.dtype:
        return self.module.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights (tied tensors once): what one decode step must read from memory."""
        # Packed and quantized layers hold their weights outside parameters and report them.
        params = sum(p.numel() * p.element_size() for p in self.module.parameters())
        return params + sum(getattr(m, "weight_bytes", 0) for m in self.module.modules() if m is not self.module)


def default_model_dir() -> Path:
    """The bundled default target model."""
    return bundled_model_dir()


def _generation_config(model_dir: Path) -> dict[str, Any]:
    path = model_file(model_dir, "generation_config.json")
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path}: must hold a JSON object")
    return raw


def load_model(
    path: str | Path | None = None, dtype: str | torch.dtype = "float32", max_model_len: int | None = None
) -> Model:
    """Load a model directory, a Hugging Face id (`org/name[@revision]`), or (None) the bundled model.

    `max_model_len`: the context it will serve (default: the model's, at most DEFAULT_CONTEXT);
    rotary tables are built for that many positions (an engine given a longer context extends them).
    """
    resolved = resolve_model(path)
    model_dir = resolved.path
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ModelLoadError(f"dtype {dtype!r} is not supported (supported: {', '.join(DTYPES)})")
        dtype = DTYPES[dtype]
    config = load_config(model_dir)
    files = checkpoint_files(model_dir)
    check_checkpoint(config, files, str(model_file(model_dir, "config.json")))
    tokenizer = Tokenizer(model_dir)
    positions = min(config.max_position_embeddings, max_model_len or DEFAULT_CONTEXT)
    module = Transformer.empty(config, dtype, max_positions=positions)
    load_weights(module, files)
    module.eval().requires_grad_(False)
    gen = _generation_config(model_dir)
    eos = gen.get("eos_token_id", None)
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else config.eos_token_ids)
    if not eos_ids and tokenizer.eos_token_id is not None:
        eos_ids = (tokenizer.eos_token_id,)
    if tokenizer.vocab_size > config.vocab_size:
        raise ModelLoadError(
            f"{model_dir / 'tokenizer.json'}: {tokenizer.vocab_size} tokens, more than config.json's "
            f"vocab_size {config.vocab_size}"
        )
    return Model(resolved.name, model_dir, config, module, tokenizer, eos_ids, gen)
