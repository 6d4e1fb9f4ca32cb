"""The fused decoder (every layer of a decode step in one C call) gives bit for bit what the
layer-by-layer path gives, for int8 and int4, float32 and bfloat16 caches, GQA, biases and
sliding windows (the tiny Llama, Qwen2 and Mistral)."""

import pytest
import torch

from tandem.kernels import DECODE_MAX_TOKENS, quant_kernels_available
from tandem.model import load_model
from tandem.model.forward_batch import ForwardBatch
from tandem.model.transformer import KVCache
from tandem.optimize import apply_recipe

pytestmark = pytest.mark.skipif(not quant_kernels_available(), reason="no VNNI quantized kernels on this machine")


def prefilled(module, kv_dtype, starts):
    cache = KVCache(module.config, 8, 160, kv_dtype)
    gen = torch.Generator().manual_seed(len(starts))
    prompts = [torch.randint(3, 300, (s,), generator=gen).tolist() for s in starts]
    batch = ForwardBatch.build(prompts, list(range(len(starts))), [0] * len(starts), None, 1, kernels=True)
    with torch.inference_mode():
        module(batch.tokens, cache, batch)
    return cache


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("recipe", ["int8", "int4"])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_fused_decoder_matches_the_layer_path_bit_for_bit(tiny_model_dirs, arch, recipe, kv_dtype):
    module = apply_recipe(load_model(tiny_model_dirs[arch]), recipe).model.module
    starts = [5, 17, 30, 2, 9, 70]  # 70 > the tiny Mistral's sliding window
    cache = prefilled(module, kv_dtype, starts)
    rows = [[7], [8, 9, 10], [11], [12], [13, 14], [15]]  # decode rows and verification rows
    batch = ForwardBatch.build(rows, list(range(6)), starts, module.config.sliding_window, 1, kernels=True)
    saved = [(k.clone(), v.clone()) for k, v in zip(cache.k, cache.v, strict=True)]
    with torch.inference_mode():
        fused = module(batch.tokens, cache, batch)
        assert module._decode_plan[1] is not None, "the fused decoder did not serve this step"
        fused_cache = [(k.clone(), v.clone()) for k, v in zip(cache.k, cache.v, strict=True)]
        for (k, v), (k0, v0) in zip(zip(cache.k, cache.v, strict=True), saved, strict=True):
            k.copy_(k0)
            v.copy_(v0)
        module._decode_plan = (cache, None)  # the layer-by-layer path for the same step
        layered = module(batch.tokens, cache, batch)
    assert torch.equal(fused, layered)
    for (k, v), (fk, fv) in zip(zip(cache.k, cache.v, strict=True), fused_cache, strict=True):
        assert torch.equal(k, fk) and torch.equal(v, fv)


def test_prompts_and_large_steps_go_layer_by_layer(tiny_llama_dir):
    module = apply_recipe(load_model(tiny_llama_dir), "int8").model.module
    cache = KVCache(module.config, DECODE_MAX_TOKENS + 1, 64, torch.float32)
    with torch.inference_mode():
        prompt = ForwardBatch.build([[5, 6, 7]], [0], [0], None, 1, kernels=True)
        module(prompt.tokens, cache, prompt)
        assert module._decode_plan is None
        wide = ForwardBatch.build(
            [[5]] * (DECODE_MAX_TOKENS + 1), list(range(DECODE_MAX_TOKENS + 1)), [3] * 17, None, 1, True
        )
        module(wide.tokens, cache, wide)
        assert module._decode_plan is None


def test_models_without_packed_linears_go_layer_by_layer(tiny_llama_dir):
    module = apply_recipe(load_model(tiny_llama_dir), "int8(small_batch_kernel=false)").model.module
    cache = prefilled(module, torch.float32, [4])
    batch = ForwardBatch.build([[9]], [0], [4], None, 1, kernels=True)
    with torch.inference_mode():
        module(batch.tokens, cache, batch)
    assert module._decode_plan == (cache, None)
