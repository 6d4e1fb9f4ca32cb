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

pytestmark = pytest.mark.skipif(not quant_kernels_available(), reason="no quantized kernels (VNNI, AVX2) here")


BLOCK = 16


def scattered_tables(rows: int, blocks_each: int = 10) -> list[list[int]]:
    """Block tables over a pool of rows * blocks_each blocks, each row's blocks scattered across it."""
    order = torch.randperm(rows * blocks_each, generator=torch.Generator().manual_seed(rows)).tolist()
    return [order[i * blocks_each : (i + 1) * blocks_each] for i in range(rows)]


def prefilled(module, kv_dtype, starts):
    cache = KVCache(module.config, len(starts) * 10, BLOCK, kv_dtype)
    gen = torch.Generator().manual_seed(len(starts))
    prompts = [torch.randint(3, 300, (s,), generator=gen).tolist() for s in starts]
    tables = scattered_tables(len(starts))
    batch = ForwardBatch.build(prompts, tables, [0] * len(starts), BLOCK, None, 1, kernels=True)
    with torch.inference_mode():
        module(batch.tokens, cache, batch)
    return cache, tables


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("recipe", ["int8", "int4"])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_fused_decoder_matches_the_layer_path_bit_for_bit(tiny_model_dirs, arch, recipe, kv_dtype):
    module = apply_recipe(load_model(tiny_model_dirs[arch]), recipe).model.module
    starts = [5, 17, 30, 2, 9, 70]  # 70 > the tiny Mistral's sliding window
    cache, tables = prefilled(module, kv_dtype, starts)
    rows = [[7], [8, 9, 10], [11], [12], [13, 14], [15]]  # decode rows and verification rows
    batch = ForwardBatch.build(rows, tables, starts, BLOCK, module.config.sliding_window, 1, kernels=True)
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
    cache = KVCache(module.config, DECODE_MAX_TOKENS + 1, BLOCK, torch.float32)
    with torch.inference_mode():
        prompt = ForwardBatch.build([[5, 6, 7]], [[0]], [0], BLOCK, None, 1, kernels=True)
        module(prompt.tokens, cache, prompt)
        assert module._decode_plan is None
        rows = DECODE_MAX_TOKENS + 1
        wide = ForwardBatch.build([[5]] * rows, [[i] for i in range(rows)], [3] * rows, BLOCK, None, 1, True)
        module(wide.tokens, cache, wide)
        assert module._decode_plan is None


def test_models_without_packed_linears_go_layer_by_layer(tiny_llama_dir):
    module = apply_recipe(load_model(tiny_llama_dir), "int8(small_batch_kernel=false)").model.module
    cache, tables = prefilled(module, torch.float32, [4])
    batch = ForwardBatch.build([[9]], tables, [4], BLOCK, None, 1, kernels=True)
    with torch.inference_mode():
        module(batch.tokens, cache, batch)
    assert module._decode_plan == (cache, None)
