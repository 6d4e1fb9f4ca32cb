"""int4: group-wise 4-bit weights: the quantizer's rounding, the layer against a dequantized
reference, recipe parameters, the engine, and perplexity on the bundled model within 5%."""

import json

import pytest
import torch

from tandem.data.bundled import heldout_sample_path
from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import default_model_dir, load_model
from tandem.optimize import RecipeError, apply_recipe
from tandem.optimize.int4 import Int4Linear, quantize_int4
from tandem.zoo.evaluate import model_score

SAMPLE = heldout_sample_path()


def test_quantizer_rounds_to_the_nearest_level_of_each_group():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(24, 100, generator=gen)
    w[3, 32:64] = 0.0  # an all-zero group
    q, scales = quantize_int4(w, 32)
    assert q.shape == (24, 100) and scales.shape == (24, 4) and scales.dtype == torch.float16
    assert q.min() >= -8 and q.max() <= 7
    assert scales[3, 1] == 0 and (q[3, 32:64] == 0).all()
    # The largest-magnitude weight of a group lands exactly on -8.
    group = w[0, :32]
    assert q[0, group.abs().argmax()] == -8
    deq = q.float().view(24, -1)[:, :96].view(24, 3, 32) * scales[:, :3].float()[..., None]
    err = (deq.view(24, 96) - w[:, :96]).abs()
    step = scales[:, :3].float().abs().repeat_interleave(32, 1)
    inside = q[:, :96] < 7  # 7 also takes the values that would round to 8 (the other sign's end)
    assert (err[inside] <= step[inside] / 2 + 1e-6).all()  # round to nearest
    assert (err <= step + 1e-6).all()


@pytest.mark.parametrize("rows", [1, 3, 8, 40])
def test_layer_matches_the_dequantized_matmul(rows):
    gen = torch.Generator().manual_seed(rows)
    linear = torch.nn.Linear(256, 72, bias=True)
    layer = Int4Linear(linear, group_size=64)
    q, scales = quantize_int4(linear.weight.detach(), 64)
    w = (q.float().view(72, 4, 64) * scales.float()[..., None]).view(72, 256)
    x = torch.randn(rows, 256, generator=gen)
    expected = x @ w.t() + linear.bias.detach()
    got = layer(x)
    if layer.kernel:
        # The kernel quantizes activations to 8 bits per row: about 1/254 of a row's range per value.
        assert (got - expected).abs().max() <= 0.02 * expected.abs().max()
        assert torch.equal(layer(x[:1]), got[:1])  # a row's output does not depend on the batch
    else:
        # No VNNI kernel on this CPU: the torch path multiplies float activations by the same
        # dequantized weights (W4A16), so only the float summation order differs.
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(layer(x[:1]), got[:1], atol=1e-5, rtol=1e-5)


def test_recipe_parameters_are_checked(tiny_llama_dir):
    optimized = apply_recipe(load_model(tiny_llama_dir), "int4(group_size=64, lm_head=false)")
    module = optimized.model.module
    assert isinstance(module.layers[0].mlp.down_proj, Int4Linear)
    assert module.layers[0].mlp.down_proj.group_size == 64
    assert type(module.lm_head) is torch.nn.Linear
    base = load_model(tiny_llama_dir)
    headed = apply_recipe(load_model(tiny_llama_dir), "int4")
    assert isinstance(headed.model.module.lm_head, Int4Linear)
    int8 = apply_recipe(load_model(tiny_llama_dir), "int8(small_batch_kernel=false)")
    assert headed.model.weight_bytes < int8.model.weight_bytes < base.weight_bytes
    with pytest.raises(RecipeError, match="multiple of 8"):
        apply_recipe(load_model(tiny_llama_dir), "int4(group_size=12)")
    with pytest.raises(RecipeError, match="no parameter .*takes group_size: int = 32, lm_head"):
        apply_recipe(load_model(tiny_llama_dir), "int4(bits=3)")


def test_int4_serves_in_the_engine_with_batches_of_any_size(tiny_llama_dir):
    engine = Engine(apply_recipe(load_model(tiny_llama_dir), "int4"), EngineConfig(max_model_len=128))
    params = SamplingParams.greedy_params(12, ignore_eos=True)
    prompts = [[0, *range(5, 5 + n)] for n in (3, 30, 11, 60, 7)]
    together = [o.token_ids for o in engine.generate(prompts, params)]
    alone = [engine.generate([p], params)[0].token_ids for p in prompts]
    assert together == alone


def test_int4_perplexity_on_the_bundled_model_is_within_5_percent():
    tokenizer = load_model(default_model_dir()).tokenizer
    ids = [tokenizer.encode(f["text"]) for f in json.loads(SAMPLE.read_text())["files"]]
    wins = [torch.tensor(t[i : i + 256]) for t in ids for i in range(0, len(t) - 32, 256)][:16]
    base = model_score(load_model().module, wins)
    int4 = model_score(apply_recipe(load_model(), "int4").model.module, wins)
    assert int4.perplexity <= 1.05 * base.perplexity, (int4.perplexity, base.perplexity)
