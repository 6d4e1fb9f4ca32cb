"""Each kind of bad model directory fails with a ModelLoadError naming the file or field."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.model import ModelLoadError, load_model


@pytest.fixture
def model_copy(tiny_llama_dir, tmp_path):
    dst = tmp_path / "m"
    shutil.copytree(tiny_llama_dir, dst)
    return dst


def edit_config(path, **changes):
    raw = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nowhere")


def test_missing_config(model_copy):
    (model_copy / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json: missing"):
        load_model(model_copy)


def test_config_not_json(model_copy):
    (model_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json: not valid JSON"):
        load_model(model_copy)


def test_unknown_architecture(model_copy):
    edit_config(model_copy, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelLoadError, match="'architectures' = 'GPT2LMHeadModel' is not supported.*Llama"):
        load_model(model_copy)


def test_missing_field(model_copy):
    edit_config(model_copy, hidden_size=None)
    with pytest.raises(ModelLoadError, match="missing required field 'hidden_size'"):
        load_model(model_copy)


def test_wrong_field_type(model_copy):
    edit_config(model_copy, num_hidden_layers="two")
    with pytest.raises(ModelLoadError, match="'num_hidden_layers' must be int"):
        load_model(model_copy)


def test_unsupported_rope_scaling(model_copy):
    edit_config(model_copy, rope_parameters={"rope_type": "yarn", "factor": 4.0}, rope_scaling=None)
    with pytest.raises(ModelLoadError, match="yarn.*not supported"):
        load_model(model_copy)


def test_missing_weights_file(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: missing"):
        load_model(model_copy)


def test_pickle_checkpoint_refused(model_copy):
    weights = load_file(model_copy / "model.safetensors")
    (model_copy / "model.safetensors").unlink()
    torch.save(weights, model_copy / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"pytorch_model\.bin.*safetensors only"):
        load_model(model_copy)


def test_shape_mismatch_names_tensor(model_copy):
    edit_config(model_copy, intermediate_size=160)
    tensor = r"tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight' in model\.safetensors has shape"
    with pytest.raises(ModelLoadError, match=r"field 'intermediate_size' = 160 .* " + tensor):
        load_model(model_copy)


def test_truncated_file(model_copy):
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: corrupt or truncated"):
        load_model(model_copy)


def test_corrupt_header(model_copy):
    path = model_copy / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage-header}" + b"\x00" * 64)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: corrupt or truncated"):
        load_model(model_copy)


def test_missing_tensor(model_copy):
    weights = load_file(model_copy / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, model_copy / "model.safetensors")
    with pytest.raises(ModelLoadError, match="missing tensor.*norm.weight"):
        load_model(model_copy)


def test_sharded_checkpoint_loads_and_missing_shard_is_named(model_copy, tiny_llama_dir):
    weights = load_file(model_copy / "model.safetensors")
    (model_copy / "model.safetensors").unlink()
    names = sorted(weights)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: weights[k] for k in keys}, model_copy / shard)
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    sharded, single = load_model(model_copy), load_model(tiny_llama_dir)
    tokens = torch.arange(3, 20)[None]
    assert torch.equal(sharded.module(tokens), single.module(tokens))
    (model_copy / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"shard file\(s\) missing: model-00002-of-00002\.safetensors"):
        load_model(model_copy)


def test_missing_tokenizer(model_copy):
    (model_copy / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json: missing"):
        load_model(model_copy)


def test_unknown_dtype(tiny_llama_dir):
    with pytest.raises(ModelLoadError, match="dtype 'float8' is not supported"):
        load_model(tiny_llama_dir, dtype="float8")
