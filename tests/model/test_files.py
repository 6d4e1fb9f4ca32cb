"""Model files stay inside their directory: a symlink or a shard name that leads out is refused, while a
Hugging Face cache snapshot (files linked into its own repository's blobs/) keeps loading."""

from __future__ import annotations

import json
import shutil

import pytest

from tandem.model import ModelLoadError, load_model
from tandem.model.files import allowed_root, model_file

from .test_hub import _add_snapshot


@pytest.fixture
def model_copy(tiny_llama_dir, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, dst)
    return dst


def test_a_symlink_out_of_the_model_directory_is_refused(model_copy, tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"version": "1.0"}')
    (model_copy / "tokenizer.json").unlink()
    (model_copy / "tokenizer.json").symlink_to(secret)
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json: leads outside the model directory"):
        load_model(model_copy)


def test_a_symlink_within_the_directory_is_fine(model_copy):
    (model_copy / "config.json").rename(model_copy / "real-config.json")
    (model_copy / "config.json").symlink_to("real-config.json")
    assert load_model(model_copy).config.num_hidden_layers == 2


def test_a_shard_named_outside_the_directory_is_refused(model_copy, tmp_path):
    shutil.copy(model_copy / "model.safetensors", tmp_path / "elsewhere.safetensors")
    (model_copy / "model.safetensors").unlink()
    (model_copy / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}})
    )
    with pytest.raises(ModelLoadError, match="leads outside the model directory"):
        load_model(model_copy)


def test_a_hub_snapshot_links_into_its_own_blobs_but_not_into_another_repositorys(tiny_llama_dir, tmp_path):
    cache = tmp_path / "hub"
    files = {p.name: p for p in tiny_llama_dir.iterdir() if p.is_file()}
    snapshot = _add_snapshot(cache, "org/tiny", files)
    assert allowed_root(snapshot) == (cache / "models--org--tiny").resolve()
    assert load_model(snapshot).config.num_hidden_layers == 2  # every file is a link to ../../blobs/
    other = _add_snapshot(cache, "org/other", {"config.json": tiny_llama_dir / "config.json"})
    borrowed = snapshot / "config.json"
    borrowed.unlink()
    borrowed.symlink_to(other / "config.json")  # into org/other's blobs
    with pytest.raises(ModelLoadError, match="leads outside"):
        model_file(snapshot, "config.json")
