"""Rotary position embeddings (default, linear and llama3 scaling), as Hugging Face computes them."""

from __future__ import annotations

import math

import torch

from tandem.model.config import ModelConfig

__all__ = ["rope_tables", "apply_rope"]


def _inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    # On the CPU whatever the default device: under torch.device("meta") (Transformer.empty) the
    # division would run torch's Python reference and import torch._dynamo (1.5 s per process).
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    # llama3: long wavelengths are slowed down by `factor`, short ones kept, a smooth ramp between.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(config: ModelConfig, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape [max_positions, head_dim], float32."""
    inv_freq = _inv_freq(config)
    positions = torch.arange(max_positions, dtype=torch.float32, device="cpu")
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, heads, head_dim]; cos/sin: [B, T, 1, head_dim] in x's dtype (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
