"""Model shapes: the bundled sizes obey the issue's bounds, and the FLOP count is what torch measures."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tandem.model import Transformer
from tandem.zoo.shapes import (
    DRAFT_SHAPE,
    TARGET_SHAPE,
    TINY_TARGET_SHAPE,
    ModelShape,
    matmul_flops_per_token,
    model_config,
)


def _config(shape):
    return model_config(shape, vocab_size=8192, max_positions=512, bos_id=0, eos_id=1)


def test_bundled_target_size_and_draft_cost_bound():
    target, draft = _config(TARGET_SHAPE), _config(DRAFT_SHAPE)
    assert 10e6 <= target.num_parameters <= 30e6
    assert matmul_flops_per_token(draft) <= matmul_flops_per_token(target) / 8
    assert matmul_flops_per_token(draft, 512) <= matmul_flops_per_token(target, 512) / 8
    assert target.tie_word_embeddings and target.architecture == "LlamaForCausalLM"


def test_weight_flops_equal_torch_flop_counter():
    config = model_config(TINY_TARGET_SHAPE, vocab_size=320, max_positions=64, bos_id=0, eos_id=1)
    module = Transformer(config)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module.logits(module(torch.zeros(1, 12, dtype=torch.long)))
    assert counter.get_total_flops() == 12 * matmul_flops_per_token(config)


def test_attention_flops_grow_with_context():
    config = _config(TARGET_SHAPE)
    extra = matmul_flops_per_token(config, 100) - matmul_flops_per_token(config)
    assert extra == 2 * 2 * 100 * 384 * 8


def test_shape_rejects_indivisible_heads():
    with pytest.raises(ValueError):
        ModelShape(hidden_size=100, num_layers=1, num_heads=3, num_kv_heads=1, intermediate_size=64)
