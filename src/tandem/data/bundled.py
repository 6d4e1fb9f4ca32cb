"""Where the bundled models live: package data, so an installed tandem has its default model.

Standard library only (the gate, the workload and the CLI find these without loading torch).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BUNDLED_MODELS", "bundled_model_dir", "bundled_draft_dir", "heldout_sample_path"]

BUNDLED_MODELS = Path(__file__).resolve().parent / "models"


def bundled_model_dir() -> Path:
    """The bundled default target model."""
    return BUNDLED_MODELS / "tandem-code-target"


def bundled_draft_dir() -> Path:
    """The bundled draft model (the speculative recipe's default draft)."""
    return BUNDLED_MODELS / "tandem-code-draft"


def heldout_sample_path() -> Path:
    """Held-out code the bundled models never trained on (prompt text for benchmarks and evaluation)."""
    return BUNDLED_MODELS / "tandem-code-heldout-sample.json"
