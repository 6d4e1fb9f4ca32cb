"""tandem.zoo: builds the bundled models (tokenizer, target, distilled draft) from the Python stdlib.

Names load lazily: `tandem --help` imports the zoo's CLI, which must not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BuildConfig",
    "Corpus",
    "DRAFT_DIR_NAME",
    "HeldoutScore",
    "ModelShape",
    "SAMPLE_FILE_NAME",
    "TARGET_DIR_NAME",
    "build_models",
    "distill",
    "load_corpus",
    "load_sample",
    "matmul_flops_per_token",
    "model_score",
    "preset_config",
    "pretrain",
    "top1_agreement",
    "train_tokenizer",
    "unigram_score",
]

_HOME = {
    "BuildConfig": "build",
    "DRAFT_DIR_NAME": "build",
    "TARGET_DIR_NAME": "build",
    "build_models": "build",
    "Corpus": "corpus",
    "load_corpus": "corpus",
    "distill": "distill",
    "HeldoutScore": "evaluate",
    "model_score": "evaluate",
    "top1_agreement": "evaluate",
    "unigram_score": "evaluate",
    "preset_config": "presets",
    "SAMPLE_FILE_NAME": "sample",
    "load_sample": "sample",
    "ModelShape": "shapes",
    "matmul_flops_per_token": "shapes",
    "train_tokenizer": "tokenizer",
    "pretrain": "train",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'tandem.zoo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tandem.zoo.{_HOME[name]}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
