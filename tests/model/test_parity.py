"""Parity: tandem's forward pass against Hugging Face transformers, the oracle, for each architecture."""

import pytest
import torch
import transformers

from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import load_model

ARCHS = ["llama", "mistral", "qwen2"]


@pytest.fixture(scope="module")
def pairs(tiny_model_dirs):
    out = {}
    for arch in ARCHS:
        path = tiny_model_dirs[arch]
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        out[arch] = (load_model(path), hf)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_full_sequence_logits_match_transformers(pairs, arch):
    ours, hf = pairs[arch]
    tokens = torch.randint(3, ours.config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        actual = ours.module.logits(ours.module(tokens))
    assert torch.allclose(actual, expected, atol=1e-4, rtol=0), (actual - expected).abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_incremental_logits_match_transformers(pairs, arch):
    """Chunked prefill then one-token decode steps through the KV cache give the same logits."""
    ours, hf = pairs[arch]
    tokens = torch.randint(3, ours.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(tokens).logits[0]
    engine = Engine(ours, EngineConfig(max_model_len=64, kv_cache_tokens=64 * 3))
    ids = tokens[0].tolist()
    runner = engine.runner
    table = [7, 2, 11, 4]  # 64 positions in blocks of 16, scattered in the pool
    rows = [runner.forward([ids[:16]], [table], [0], last_only=False)[0]]
    rows.append(runner.forward([ids[16:30]], [table], [16], last_only=False)[0])
    rows += [runner.forward([[t]], [table], [i], last_only=False)[0] for i, t in enumerate(ids[30:], start=30)]
    actual = torch.cat(rows)
    assert torch.allclose(actual, expected, atol=1e-4, rtol=0), (actual - expected).abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_32_greedy_tokens_identical_to_transformers_generate(pairs, arch):
    ours, hf = pairs[arch]
    prompt = ours.tokenizer.encode("def add(a, b):\n    return")
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=2
        )[0, len(prompt) :].tolist()
    engine = Engine(ours, EngineConfig(max_model_len=128, kv_cache_tokens=256))
    out = engine.generate([prompt], SamplingParams.greedy_params(32, ignore_eos=True))[0]
    assert out.token_ids == ref


def test_bf16_logits_close_to_fp32(tiny_llama_dir):
    fp32, bf16 = load_model(tiny_llama_dir), load_model(tiny_llama_dir, dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    tokens = torch.randint(3, 300, (1, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = fp32.module.logits(fp32.module(tokens))
        b = bf16.module.logits(bf16.module(tokens))
    assert (a - b).abs().max() < 0.1 * a.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8
