"""Named build configurations: the committed models, and a tiny one for tests and dry runs."""

from __future__ import annotations

from tandem.zoo.build import BuildConfig
from tandem.zoo.shapes import TINY_DRAFT_SHAPE, TINY_TARGET_SHAPE

__all__ = ["preset_config"]


def preset_config(name: str) -> BuildConfig:
    if name == "bundled":
        return BuildConfig()
    if name == "tiny":
        # Seconds on any CPU: a few steps of two very small models on short windows.
        return BuildConfig(
            vocab_size=512,
            seq_len=64,
            batch_size=4,
            target=TINY_TARGET_SHAPE,
            draft=TINY_DRAFT_SHAPE,
            target_steps=20,
            draft_steps=20,
            warmup_steps=5,
            target_lr=3e-3,
            draft_lr=3e-3,
            heldout_fraction=0.2,
            sample_bytes=4_000,
        )
    raise ValueError(f"unknown preset {name!r} (known: bundled, tiny)")
