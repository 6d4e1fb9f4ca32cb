"""int8: per-channel int8 Linear layers stay close to fp32; the LM head stays fp32 unless asked."""

import pytest
import torch

from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import load_model
from tandem.optimize import apply_recipe
from tandem.optimize.int8 import Int8Linear


def test_quantizes_the_linears_and_leaves_the_input_untouched(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    optimized = apply_recipe(model, "int8(lm_head=False)")
    module = optimized.model.module
    assert isinstance(module.layers[0].self_attn.qkv_proj, Int8Linear)
    assert isinstance(module.layers[1].mlp.down_proj, Int8Linear)
    assert type(module.lm_head) is torch.nn.Linear
    assert type(model.module.layers[0].self_attn.qkv_proj) is torch.nn.Linear  # a copy was quantized
    # Quantized layers: 1 byte per weight for fbgemm, 1 more for the small-batch kernel's copy
    # (2 in all, half of fp32), unless that kernel is turned off.
    assert optimized.model.weight_bytes < 0.75 * model.weight_bytes
    lean = apply_recipe(load_model(tiny_llama_dir), "int8(lm_head=False, small_batch_kernel=false)")
    assert lean.model.weight_bytes < 0.6 * model.weight_bytes
    headed = apply_recipe(load_model(tiny_llama_dir), "int8")  # the head is quantized by default
    assert isinstance(headed.model.module.lm_head, Int8Linear)
    assert type(headed.model.module.embed_tokens) is torch.nn.Embedding


def test_int8_logits_are_close_to_fp32(tiny_llama_dir):
    model = load_model(tiny_llama_dir)
    quantized = apply_recipe(load_model(tiny_llama_dir), "int8").model
    tokens = torch.randint(3, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.module.logits(model.module(tokens))
        out = quantized.module.logits(quantized.module(tokens))
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_int8_runs_in_the_engine_with_speculation(tiny_llama_dir, tiny_draft_dir):
    optimized = apply_recipe(load_model(tiny_llama_dir), f"int8+speculative(k=3, draft={tiny_draft_dir})")
    assert optimized.applied == (("int8", "1.0"), ("speculative", "1.0"))
    plain = Engine(apply_recipe(load_model(tiny_llama_dir), "int8"), EngineConfig(max_model_len=128))
    spec = Engine(optimized, EngineConfig(max_model_len=128))
    params = SamplingParams.greedy_params(20, ignore_eos=True)
    assert spec.generate([[0, 5, 6, 7]], params)[0].token_ids == plain.generate([[0, 5, 6, 7]], params)[0].token_ids


def test_int8_rows_do_not_depend_on_the_rest_of_the_batch(tiny_llama_dir):
    """Continuous batching must not change a request's greedy output, so each row is exact alone."""
    layer = Int8Linear(torch.nn.Linear(64, 32))
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(0))
    x[3] *= 100  # a row with a much larger range must not coarsen the others' quantization
    together = layer(x)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(20)])
    assert torch.equal(together, alone)  # 20 rows through fbgemm, 1 row through the packed VNNI kernel
    assert torch.equal(layer(x[:5]), alone[:5])  # 5 rows through the packed kernel
    optimized = apply_recipe(load_model(tiny_llama_dir), "int8")
    engine = Engine(optimized, EngineConfig(max_model_len=128, kv_cache_tokens=128 * 8))
    prompts = [[0, *range(5, 5 + n)] for n in (3, 30, 11, 60, 7)]
    params = SamplingParams.greedy_params(24, ignore_eos=True)
    solo = [engine.generate([p], params)[0].token_ids for p in prompts]
    assert [o.token_ids for o in engine.generate(prompts, params)] == solo


def test_int8_layers_reuse_one_growing_input_buffer_in_any_mode():
    """Rows are written into a shared scratch buffer; it grows on demand, and one first made under
    inference mode still takes writes outside it."""
    linear = torch.nn.Linear(16, 8)
    ref = Int8Linear(linear)
    x = torch.randn(300, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        small = ref(x[:3])
    big = ref(x)  # outside inference mode, and past the buffer's first size
    assert torch.equal(big[:3], small)
    assert torch.allclose(big, linear(x), atol=0.05 * linear(x).abs().max().item())


def test_fused_row_scaling_matches_the_torch_ops():
    """The C kernels (one pass each side of the matmul) and the four torch ops quantize alike."""
    layer = Int8Linear(torch.nn.Linear(96, 40))
    if not layer.fused:
        pytest.skip("C kernels not built on this machine")
    x = torch.randn(37, 96, generator=torch.Generator().manual_seed(4)) * torch.logspace(-2, 2, 37)[:, None]
    fused = layer(x)
    layer.fused = False
    torch.testing.assert_close(fused, layer(x), atol=1e-5, rtol=1e-5)


def test_small_batches_keep_the_input_shape_and_dtype():
    """1-4 rows take the small-batch kernel when it is built; the layer's contract is the same."""
    layer = Int8Linear(torch.nn.Linear(64, 32))
    x = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(5))
    out = layer(x)
    assert out.shape == (1, 3, 32) and out.dtype == torch.float32
    half = layer(x.to(torch.bfloat16))
    assert half.shape == (1, 3, 32) and half.dtype == torch.bfloat16
    assert layer(torch.randn(0, 64)).shape == (0, 32)
