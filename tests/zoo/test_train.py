"""The training loop: seeded init and schedule, loss goes down, identical runs give identical weights."""

import math

import pytest
import torch

from tandem.model import Transformer
from tandem.zoo.shapes import TINY_TARGET_SHAPE, model_config
from tandem.zoo.tokens import WindowSampler
from tandem.zoo.train import TrainConfig, _lr_at, init_weights, lm_loss, pretrain


def _module(layers: int = 2) -> Transformer:
    shape = TINY_TARGET_SHAPE
    config = model_config(shape, vocab_size=64, max_positions=32, bos_id=0, eos_id=1)
    return Transformer(config)


def _stream() -> torch.Tensor:
    # A learnable stream: a fixed 7-token phrase repeated with a counter token between repeats.
    phrase = [5, 9, 12, 9, 30, 41, 7]
    return torch.tensor([t for i in range(200) for t in (*phrase, 10 + i % 3)])


def test_init_is_seeded_and_scales_residual_outputs():
    a, b, c = _module(), _module(), _module()
    init_weights(a, seed=1), init_weights(b, seed=1), init_weights(c, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.embed_tokens.weight, c.embed_tokens.weight)
    layer = a.layers[0]
    assert layer.mlp.down_proj.weight.std() < 0.6 * layer.mlp.gate_up_proj.weight.std()
    assert torch.all(layer.input_layernorm.weight == 1)


def test_schedule_warms_up_then_decays_to_the_floor():
    config = TrainConfig(steps=100, lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [_lr_at(s, config) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(x >= y for x, y in zip(lrs[9:], lrs[10:], strict=False))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.01)


def _train(seed: int = 0, steps: int = 40):
    torch.manual_seed(0)
    module = _module()
    sampler = WindowSampler(_stream(), seq_len=16, batch_size=4, seed=seed)
    result = pretrain(module, sampler, TrainConfig(steps=steps, lr=1e-2, warmup_steps=5, seed=seed))
    return module, result


def test_pretraining_learns_a_repetitive_stream():
    module, result = _train()
    assert result.tokens_seen == 40 * 4 * 16 and len(result.losses) == 40
    assert result.losses[0] > math.log(64) - 0.5  # starts near uniform over 64 tokens
    assert result.final_loss < 1.0
    assert not module.training
    with torch.no_grad():
        assert lm_loss(module, _stream()[None, :33]).item() < 1.0


def test_same_seed_same_weights():
    (a, _), (b, _) = _train(seed=3, steps=5), _train(seed=3, steps=5)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
