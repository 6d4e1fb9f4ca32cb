"""llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) for the external-engine tests.

`make external` (deploy/external/build_llamacpp.sh) builds it once into the user's cache: a venv
with the compiled wheel, and the llama.cpp source whose `convert_hf_to_gguf.py` turns the bundled
model into a GGUF here (once, cached next to it). Tests marked `external` skip, saying so, until
it is built.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tandem.data.bundled import bundled_model_dir

__all__ = ["EXTERNAL", "bundled_gguf", "llamacpp_command", "llamacpp_python", "require_llamacpp"]

VERSION = "0.3.36"
EXTERNAL = Path(os.environ.get("TANDEM_CACHE") or Path.home() / ".cache" / "tandem") / "external"
SOURCE = EXTERNAL / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"

# The bundled tokenizer is byte-level BPE with GPT-2's split regex, which the converter's table of
# known tokenizers (by hash) does not list: tell it so, without editing the cached source.
_CONVERT = """
import runpy, sys
root = sys.argv.pop(1)
sys.path[:0] = [root, root + "/gguf-py"]
from conversion.base import TextModel
known = TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
TextModel.get_vocab_base_pre = pre
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def llamacpp_python() -> Path | None:
    python = EXTERNAL / "llamacpp-venv" / "bin" / "python"
    return python if python.exists() and (SOURCE / "convert_hf_to_gguf.py").exists() else None


def require_llamacpp() -> Path:
    python = llamacpp_python()
    if python is None:
        pytest.skip(f"llama.cpp's server is not built in {EXTERNAL}: run `make external` (about 20 minutes once)")
    return python


def bundled_gguf(outtype: str = "f32") -> Path:
    """The bundled model as a GGUF (converted once per model version, cached)."""
    python = require_llamacpp()
    model = bundled_model_dir()
    digest = hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()[:12]
    out = EXTERNAL / "gguf" / f"{model.name}-{digest}-{outtype}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        subprocess.run(
            [str(python), "-c", _CONVERT, str(SOURCE), str(model), "--outtype", outtype, "--outfile", str(partial)],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
        partial.rename(out)
    return out


def llamacpp_command(python: Path) -> list[str]:
    """The external variant's command template for llama-cpp-python's server."""
    return [
        str(python), "-m", "llama_cpp.server", "--model", "{model}", "--host", "{host}", "--port", "{port}",
        "--n_threads", "{threads}", "--n_ctx", "512", "--model_alias", "{served_model_name}", "--logits_all", "true",
    ]  # fmt: skip
