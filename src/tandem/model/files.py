"""Files of a model directory, confined to it: a symlink (or a shard name) may not lead outside.

A model directory is untrusted input: `tokenizer.json -> /etc/shadow`, or a sharded index naming
`../../secrets.safetensors`, would otherwise be read (and parts of it echoed in error messages).
`model_file(dir, name)` returns `dir / name` once the real path it leads to lies inside the
directory, and raises ModelLoadError otherwise.

One layout links outside on purpose: a Hugging Face cache snapshot (`models--org--name/snapshots/
<commit>/config.json -> ../../blobs/<sha256>`, see tandem.model.hub). There the allowed root is
the repository's folder, which holds both its snapshots and its blobs: never another repository's.
"""

from __future__ import annotations

from pathlib import Path

from tandem.model.errors import ModelLoadError

__all__ = ["allowed_root", "model_file"]


def allowed_root(model_dir: Path) -> Path:
    """Where files of `model_dir` may really live: the directory, or its hub repository's folder."""
    real = Path(model_dir).resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def model_file(model_dir: Path, name: str) -> Path:
    """`model_dir / name`, if what it leads to (through any symlink) stays inside allowed_root(model_dir)."""
    path = Path(model_dir) / name
    real = path.resolve()
    root = allowed_root(model_dir)
    if not real.is_relative_to(root):
        raise ModelLoadError(
            f"{path}: leads outside the model directory (to {real}); model files must lie inside it "
            f"(a Hugging Face cache snapshot may link into its own repository's blobs/)"
        )
    return path
