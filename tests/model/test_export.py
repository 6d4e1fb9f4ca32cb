"""save_pretrained round-trips: tandem and transformers both load the export and agree."""

import dataclasses
import json
import shutil

import pytest
import torch
import transformers
from safetensors import safe_open

from tandem.model import ModelConfig, Transformer, load_model
from tandem.model.export import save_pretrained

ARCHS = ["llama", "mistral", "qwen2"]


def _tokens(vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(3, vocab, (2, 40), generator=torch.Generator().manual_seed(seed))


def _copy_tokenizer(source, out) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)


def _hf_logits(path, tokens) -> torch.Tensor:
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(tokens).logits


def _tandem_logits(path, tokens) -> torch.Tensor:
    model = load_model(path)
    with torch.no_grad():
        return model.module.logits(model.module(tokens))


@pytest.mark.parametrize("arch", ARCHS)
def test_reexported_hf_checkpoint_matches_the_original(tiny_model_dirs, tmp_path, arch):
    """HF checkpoint -> tandem -> save_pretrained(fp32): HF reads it back with the same logits."""
    original = tiny_model_dirs[arch]
    save_pretrained(load_model(original).module, tmp_path, dtype=torch.float32)
    _copy_tokenizer(original, tmp_path)
    tokens = _tokens(300, seed=0)
    expected = _hf_logits(original, tokens)
    assert torch.allclose(_hf_logits(tmp_path, tokens), expected, atol=1e-5, rtol=0)
    assert torch.allclose(_tandem_logits(tmp_path, tokens), expected, atol=1e-4, rtol=0)


def _config(**overrides) -> ModelConfig:
    fields = dict(
        architecture="LlamaForCausalLM",
        vocab_size=320,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_ids=(1,),
    )
    return ModelConfig(**{**fields, **overrides})


@pytest.mark.parametrize("tied", [True, False])
def test_trained_style_bf16_export_loads_in_both_and_agrees(tiny_llama_dir, tmp_path, tied):
    torch.manual_seed(0)
    module = Transformer(_config(tie_word_embeddings=tied))
    save_pretrained(module, tmp_path, pad_token_id=2)
    _copy_tokenizer(tiny_llama_dir, tmp_path)
    tokens = _tokens(300, seed=1)
    ours, theirs = _tandem_logits(tmp_path, tokens), _hf_logits(tmp_path, tokens)
    assert torch.allclose(ours, theirs, atol=1e-4, rtol=0), (ours - theirs).abs().max()
    # bf16 storage loses precision but not the model: the logits stay close to the fp32 original.
    with torch.no_grad():
        original = module.logits(module(tokens))
    assert (ours.argmax(-1) == original.argmax(-1)).float().mean() > 0.9


def test_files_use_hf_names_dtype_and_ids(tmp_path):
    module = Transformer(_config(tie_word_embeddings=True))
    save_pretrained(module, tmp_path, pad_token_id=2)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["torch_dtype"] == "bfloat16" and config["max_position_embeddings"] == 128
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 2)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 1
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        assert handle.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
        assert handle.get_tensor("model.layers.0.self_attn.k_proj.weight").shape == (32, 64)
    assert not any("qkv_proj" in n or "gate_up_proj" in n for n in names)
    assert "lm_head.weight" not in names  # tied: stored once, as HF does
    assert {"model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"} <= names


def test_refuses_what_the_architecture_cannot_express(tmp_path):
    module = Transformer(_config(qkv_bias=True, o_bias=False))
    with pytest.raises(ValueError, match="biases"):
        save_pretrained(module, tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        save_pretrained(Transformer(_config()), tmp_path, dtype=torch.int8)
    assert dataclasses.replace(_config(), architecture="Qwen2ForCausalLM").qkv_bias is False
