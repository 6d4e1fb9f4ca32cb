"""Gateway tests: the tiny model every replica serves (a longer context, so streams stay in flight)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import save_tiny

CONTEXT = 1024


@pytest.fixture(scope="session")
def serve_model_dir(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("gateway") / "tiny-serve", max_position_embeddings=CONTEXT)
