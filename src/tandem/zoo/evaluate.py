"""Held-out evaluation: loss and perplexity of a model and of a unigram baseline, and how often the
draft's greedy choice equals the target's.

All scores are over the same prediction positions (every token of the held-out windows except
each window's first), so the numbers in one table are comparable. Models run in float32 here: the
numbers describe the shipped weights, not an autocast approximation of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tandem.model.transformer import Transformer

__all__ = [
    "HeldoutScore",
    "model_score",
    "unigram_counts",
    "unigram_score",
    "top1_agreement",
]


@dataclass(frozen=True)
class HeldoutScore:
    tokens: int  # predicted positions
    loss: float  # mean negative log-likelihood, nats per token

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    def bits_per_byte(self, num_bytes: int) -> float:
        """Total bits over the text's UTF-8 bytes: comparable across tokenizers."""
        return self.loss * self.tokens / math.log(2) / num_bytes


def _logits(module: Transformer, window: torch.Tensor) -> torch.Tensor:
    return module.logits(module(window[None, :-1]))[0]


@torch.no_grad()
def model_score(module: Transformer, windows: Sequence[torch.Tensor]) -> HeldoutScore:
    total, count = 0.0, 0
    for window in windows:
        if len(window) < 2:
            continue
        logits = _logits(module, window)
        total += F.cross_entropy(logits, window[1:], reduction="sum").item()
        count += len(window) - 1
    return HeldoutScore(count, total / max(count, 1))


def unigram_counts(stream: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.bincount(stream, minlength=vocab_size).to(torch.float64)


def unigram_score(counts: torch.Tensor, windows: Sequence[torch.Tensor]) -> HeldoutScore:
    """A context-free baseline: each token's training-set frequency, add-one smoothed so a token
    never seen in training still has a finite cost."""
    log_probs = torch.log((counts + 1) / (counts.sum() + len(counts)))
    targets = torch.cat([w[1:] for w in windows if len(w) > 1])
    return HeldoutScore(len(targets), -log_probs[targets].mean().item())


@torch.no_grad()
def top1_agreement(target: Transformer, draft: Transformer, windows: Sequence[torch.Tensor]) -> float:
    """Fraction of positions where the draft's most likely next token is the target's: the rate at
    which greedy speculative decoding accepts a drafted token, one position at a time."""
    agree, count = 0, 0
    for window in windows:
        if len(window) < 2:
            continue
        same = _logits(target, window).argmax(-1) == _logits(draft, window).argmax(-1)
        agree += int(same.sum())
        count += len(same)
    return agree / max(count, 1)
