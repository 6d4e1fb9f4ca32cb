"""Distillation: the loss is KL(teacher || student) up to a constant, and training it raises agreement."""

import pytest
import torch
import torch.nn.functional as F

from tandem.model import Transformer
from tandem.zoo.distill import DistillConfig, distill, distillation_loss, soft_targets
from tandem.zoo.evaluate import top1_agreement
from tandem.zoo.shapes import TINY_DRAFT_SHAPE, TINY_TARGET_SHAPE, model_config
from tandem.zoo.tokens import WindowSampler, eval_windows
from tandem.zoo.train import TrainConfig, init_weights, pretrain


def _logits(seed: int) -> torch.Tensor:
    return torch.randn(6, 11, generator=torch.Generator().manual_seed(seed)) * 3


def test_soft_targets_are_distributions_with_the_hard_label_mixed_in():
    teacher, targets = _logits(0), torch.tensor([0, 3, 3, 10, 5, 1])
    probs = soft_targets(teacher, targets, DistillConfig(hard_label_weight=0.25))
    assert torch.allclose(probs.sum(-1), torch.ones(6))
    expected = 0.75 * F.softmax(teacher, -1) + 0.25 * F.one_hot(targets, 11)
    assert torch.allclose(probs, expected, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_loss_is_kl_plus_teacher_entropy_plus_weighted_cross_entropy(temperature):
    student, teacher, targets = _logits(1), _logits(2), torch.tensor([0, 1, 2, 3, 4, 5])
    config = DistillConfig(temperature=temperature, hard_label_weight=0.0)
    p_teacher = F.log_softmax(teacher / temperature, -1)
    p_student = F.log_softmax(student / temperature, -1)
    kl = (p_teacher.exp() * (p_teacher - p_student)).sum(-1).mean()
    entropy = -(p_teacher.exp() * p_teacher).sum(-1).mean()
    loss = distillation_loss(student, teacher, targets, config)
    assert loss.item() == pytest.approx(((kl + entropy) * temperature**2).item(), rel=1e-5)
    mixed = distillation_loss(student, teacher, targets, DistillConfig(hard_label_weight=0.1))
    if temperature == 1.0:
        ce = F.cross_entropy(student, targets)
        assert mixed.item() == pytest.approx((0.9 * (kl + entropy) + 0.1 * ce).item(), rel=1e-5)


def test_distilled_student_agrees_with_its_teacher():
    torch.manual_seed(0)
    vocab = 48
    # A teacher with structured, confident predictions: pretrained briefly on a patterned stream.
    phrase = torch.randint(2, vocab, (23,), generator=torch.Generator().manual_seed(1))
    stream = torch.cat([torch.cat([phrase, torch.tensor([i % 5 + 2])]) for i in range(120)])
    teacher = Transformer(model_config(TINY_TARGET_SHAPE, vocab, 32, 0, 1))
    pretrain(
        teacher,
        WindowSampler(stream, 16, 8, seed=0),
        TrainConfig(steps=40, lr=1e-2, warmup_steps=5, optimizer="adamw"),
    )
    student = Transformer(model_config(TINY_DRAFT_SHAPE, vocab, 32, 0, 1))
    windows = eval_windows(stream[:400], 16)
    init_weights(student, seed=9)
    before = top1_agreement(teacher, student, windows)
    config = TrainConfig(steps=40, lr=1e-2, warmup_steps=5, seed=1, optimizer="adamw")
    result = distill(student, teacher, WindowSampler(stream, 16, 8, seed=1), config)
    after = top1_agreement(teacher, student, windows)
    assert result.losses[-1] < result.losses[0]
    assert after > max(0.8, before + 0.5)
    assert all(not p.requires_grad for p in teacher.parameters())


def test_vocabularies_must_match():
    teacher = Transformer(model_config(TINY_TARGET_SHAPE, 40, 32, 0, 1))
    student = Transformer(model_config(TINY_DRAFT_SHAPE, 41, 32, 0, 1))
    with pytest.raises(ValueError, match="vocabulary"):
        distill(student, teacher, WindowSampler(torch.arange(200) % 40, 16, 2, 0), TrainConfig(steps=1, lr=1e-3))
