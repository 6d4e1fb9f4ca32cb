"""Distilling the draft from the target: match the target's whole next-token distribution.

Speculative decoding accepts a drafted token when the target agrees with it, so the draft should
imitate the target, not the data: the loss is KL(target || draft) on the target's soft labels,
which carries far more signal per token than the one-hot next token. A small weight on the plain
next-token loss keeps the draft honest where the target itself is unsure. The logged loss is the
cross-entropy against the soft targets, so it levels off at the target's entropy, not at 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from rich.console import Console

from tandem.model.transformer import Transformer
from tandem.zoo.tokens import WindowSampler
from tandem.zoo.train import TrainConfig, TrainResult, init_weights, run_training

__all__ = ["DistillConfig", "soft_targets", "distillation_loss", "distill"]


@dataclass(frozen=True)
class DistillConfig:
    temperature: float = 1.0
    hard_label_weight: float = 0.1


def soft_targets(teacher_logits: torch.Tensor, targets: torch.Tensor, config: DistillConfig) -> torch.Tensor:
    """The teacher's next-token probabilities at `temperature`, with `hard_label_weight` of the mass
    moved onto the true next token: one [N, vocab] target distribution for one cross-entropy."""
    probs = F.softmax(teacher_logits.float() / config.temperature, dim=-1)
    if config.hard_label_weight:
        probs.mul_(1 - config.hard_label_weight)
        probs.scatter_add_(1, targets[:, None], probs.new_full((len(targets), 1), config.hard_label_weight))
    return probs


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, config: DistillConfig
) -> torch.Tensor:
    """Cross-entropy of the student against `soft_targets` (scaled by T^2, as Hinton et al.).

    Against the pure teacher distribution this is KL(teacher || student) plus the teacher's entropy,
    a constant, so the gradient is the KL's; mixing the hard label into the targets equals adding
    `hard_label_weight` x next-token cross-entropy. One fused cross-entropy over [N, vocab] is about
    half the cost of a separate KL and cross-entropy, and that matters at 8k vocabulary on a CPU.
    """
    with torch.no_grad():
        probs = soft_targets(teacher_logits, targets, config)
    t = config.temperature
    return F.cross_entropy(student_logits.float() / t, probs) * t * t


def distill(
    student: Transformer,
    teacher: Transformer,
    sampler: WindowSampler,
    config: TrainConfig,
    distill_config: DistillConfig | None = None,
    console: Console | None = None,
) -> TrainResult:
    """Train `student` from scratch to imitate `teacher` (frozen) on batches from `sampler`."""
    distill_config = distill_config or DistillConfig()
    if student.config.vocab_size != teacher.config.vocab_size:
        raise ValueError("draft and target must share the vocabulary")
    teacher.eval().requires_grad_(False)
    init_weights(student, config.seed)

    def loss_fn(batch: torch.Tensor) -> torch.Tensor:
        inputs, targets = batch[:, :-1], batch[:, 1:].flatten()
        with torch.no_grad():
            teacher_logits = teacher.lm_head(teacher(inputs)).flatten(0, 1)
        student_logits = student.lm_head(student(inputs)).flatten(0, 1)
        return distillation_loss(student_logits, teacher_logits, targets, distill_config)

    return run_training(student, loss_fn, sampler, config, "draft", console)
