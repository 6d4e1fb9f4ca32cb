import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import save_tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny random Llama, Mistral and Qwen2 checkpoints in HF format, built once per session."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: save_tiny(arch, root / arch) for arch in ("llama", "mistral", "qwen2")}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_model_dirs) -> Path:
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory) -> Path:
    """A smaller random Llama sharing the tiny models' tokenizer: a (poor) draft for speculation."""
    return save_tiny("llama", tmp_path_factory.mktemp("draft") / "llama-draft", seed=1, num_hidden_layers=1)


@pytest.fixture(scope="session")
def serve_model_dir(tmp_path_factory) -> Path:
    """The tiny random Llama with a 1024-token context (so long streams stay in flight a while): the
    model real `tandem serve` replicas load in the serve, gateway and scheduling tests."""
    return save_tiny("llama", tmp_path_factory.mktemp("serve") / "tiny-serve", max_position_embeddings=1024)


GATE_TEST_PLUGINS = Path(__file__).parent / "plugins" / "tandem-gate-test-optimizers"


@pytest.fixture(scope="session")
def plugins(tmp_path_factory) -> Path:
    """The gate's broken test optimizers installed as their own distribution (found through the
    `tandem.optimizers` entry point): a folder to put on a replica's PYTHONPATH."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(GATE_TEST_PLUGINS)],
        check=True, capture_output=True, timeout=240,
    )  # fmt: skip
    return target
