"""--model org/name[@revision]: resolved offline from a cache laid out the way huggingface_hub lays it out."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.model import ModelLoadError, load_model
from tandem.model.hub import parse_hub_id, resolve_model


def _add_snapshot(cache: Path, repo_id: str, files: dict[str, Path], ref: str = "main") -> Path:
    """blobs/<sha256>, snapshots/<commit>/<name> -> ../../blobs/<sha256>, refs/<ref> = <commit>: the hub's layout."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}@{ref}".encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, source in files.items():
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tiny_llama_dir) -> Path:
    cache = tmp_path_factory.mktemp("hf") / "hub"
    files = {p.name: p for p in tiny_llama_dir.iterdir() if p.is_file()}
    _add_snapshot(cache, "tandem-test/tiny-llama", files)
    _add_snapshot(cache, "tandem-test/tiny-llama", files, ref="v1")
    pickled = tmp_path_factory.mktemp("pickled")
    shutil.copy(tiny_llama_dir / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    _add_snapshot(cache, "tandem-test/pickle-only", {"config.json": pickled / "config.json"})
    # A full-repo cache of a pickle-only model (fetched by another tool) shows its pickles by name.
    _add_snapshot(cache, "tandem-test/pickle-full", {p.name: p for p in pickled.iterdir()})
    return cache


def test_hub_ids_are_told_from_paths():
    assert parse_hub_id("Qwen/Qwen2.5-0.5B-Instruct") == ("Qwen/Qwen2.5-0.5B-Instruct", None)
    assert parse_hub_id("org/name@v1.2") == ("org/name", "v1.2")
    assert parse_hub_id("org/name@refs/pr/3") == ("org/name", "refs/pr/3")
    for not_an_id in ("./org/name", "/abs/path", "name", "a/b/c", "~/x/y"):
        assert parse_hub_id(not_an_id) is None, not_an_id


def test_an_offline_cache_serves_a_hub_id(hub_cache, tiny_llama_dir):
    resolved = resolve_model("tandem-test/tiny-llama", offline=True, cache_dir=hub_cache)
    assert resolved.source == "hub" and resolved.name == "tandem-test/tiny-llama"
    assert (resolved.path / "config.json").is_file()
    assert resolve_model("tandem-test/tiny-llama@v1", offline=True, cache_dir=hub_cache).revision == "v1"


def test_load_model_takes_a_hub_id_and_matches_the_directory(hub_cache, tiny_llama_dir, monkeypatch):
    import torch

    from tandem.model import hub

    real = hub._download
    monkeypatch.setattr(hub, "_download", lambda repo, rev, _offline, _cache: real(repo, rev, True, hub_cache))
    from_hub = load_model("tandem-test/tiny-llama")
    from_dir = load_model(tiny_llama_dir)
    assert from_hub.name == "tandem-test/tiny-llama"
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.inference_mode():
        assert torch.equal(from_hub.module(ids), from_dir.module(ids))


def test_a_pickle_only_repository_is_refused(hub_cache):
    with pytest.raises(ModelLoadError, match="no safetensors weights.*unpickling"):
        resolve_model("tandem-test/pickle-only", offline=True, cache_dir=hub_cache)
    with pytest.raises(ModelLoadError, match=r"pytorch_model\.bin"):
        resolve_model("tandem-test/pickle-full", offline=True, cache_dir=hub_cache)


def test_an_uncached_id_offline_is_a_clear_error(hub_cache):
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE is set"):
        resolve_model("tandem-test/never-downloaded", offline=True, cache_dir=hub_cache)
    with pytest.raises(ModelLoadError, match="no such revision|not in the local"):
        resolve_model("tandem-test/tiny-llama@no-such-branch", offline=True, cache_dir=hub_cache)


def test_neither_a_directory_nor_an_id(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelLoadError, match="not a directory"):
        resolve_model(str(tmp_path / "file"))


def test_the_cli_generates_from_a_hub_id_offline(hub_cache, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache), "HF_HOME": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "generate", "--model", "tandem-test/tiny-llama", "--prompt", "def",
         "--max-tokens", "4", "--threads", "1"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("def")
    refused = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "generate", "--model", "tandem-test/pickle-only", "--prompt", "x"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "no safetensors weights" in refused.stderr and "Traceback" not in refused.stderr
