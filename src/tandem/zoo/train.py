"""Training loop for the bundled models: Muon + AdamW, warmup + cosine schedule, bf16 autocast on CPU.

A fixed number of steps (not a time limit), a seeded init and a seeded batch order make a build
reproducible on the same machine. bf16 autocast: on a CPU with AVX-512 bf16 the matmuls run about
3x faster than fp32 (measured on the build machine), while weights and optimizer state stay fp32.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from rich.console import Console

from tandem.model.transformer import Transformer
from tandem.progress import StepProgress
from tandem.zoo.optim import build_optimizer, set_lr
from tandem.zoo.tokens import WindowSampler

__all__ = ["TrainConfig", "TrainResult", "init_weights", "lm_loss", "run_training", "pretrain"]


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    lr: float
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decays to this fraction of lr
    weight_decay: float = 0.1
    optimizer: str = "muon"  # or "adamw"; see tandem.zoo.optim
    adamw_lr_scale: float = 1.0  # under Muon: the embedding's and norms' lr relative to `lr`
    grad_clip: float = 1.0
    bf16: bool = True
    seed: int = 0


@dataclass
class TrainResult:
    steps: int
    tokens_seen: int
    seconds: float
    final_loss: float  # mean training loss over the last 10% of steps
    losses: list[float] = field(default_factory=list)


def init_weights(module: Transformer, seed: int, std: float = 0.02) -> None:
    """GPT-2 style init: N(0, std) everywhere, residual output projections scaled by 1/sqrt(2 layers)
    so the residual stream's variance does not grow with depth; norms at 1."""
    generator = torch.Generator().manual_seed(seed)
    residual_std = std / math.sqrt(2 * module.config.num_hidden_layers)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                scale = residual_std if ("o_proj" in name or "down_proj" in name) else std
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def lm_loss(module: Transformer, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a [B, T + 1] batch."""
    logits = module.lm_head(module(batch[:, :-1]))
    return F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


def _lr_at(step: int, config: TrainConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(config.steps - config.warmup_steps, 1)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def run_training(
    module: Transformer,
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    sampler: WindowSampler,
    config: TrainConfig,
    label: str,
    console: Console | None = None,
) -> TrainResult:
    """Run `config.steps` optimizer steps of `loss_fn(batch)` on batches from `sampler`."""
    module.train()
    optimizer = build_optimizer(module, config.optimizer, config.lr, config.weight_decay, config.adamw_lr_scale)
    tokens_per_step = sampler.batch_size * sampler.seq_len
    losses: list[float] = []
    start = time.monotonic()
    with StepProgress(label, console, log_every=25) as progress:  # a line every 25 steps in a log file
        for step in range(config.steps):
            set_lr(optimizer, _lr_at(step, config))
            batch = sampler.next_batch()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
                loss = loss_fn(batch)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{label}: loss is {loss.item()} at step {step}")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), config.grad_clip)
            optimizer.step()
            losses.append(loss.item())
            tokens_per_s = tokens_per_step * (step + 1) / max(time.monotonic() - start, 1e-9)
            progress.step(f"loss {losses[-1]:.3f} {tokens_per_s:,.0f} tok/s", step + 1, config.steps)
    module.eval()
    tail = losses[-max(1, len(losses) // 10) :]
    return TrainResult(
        steps=config.steps,
        tokens_seen=config.steps * tokens_per_step,
        seconds=time.monotonic() - start,
        final_loss=sum(tail) / len(tail),
        losses=losses,
    )


def pretrain(
    module: Transformer, sampler: WindowSampler, config: TrainConfig, console: Console | None = None
) -> TrainResult:
    """Train the target from scratch on next-token prediction."""
    init_weights(module, config.seed)
    return run_training(module, lambda batch: lm_loss(module, batch), sampler, config, "target", console)
