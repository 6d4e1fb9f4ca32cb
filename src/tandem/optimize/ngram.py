"""`ngram`: prompt-lookup speculation. No draft model: the continuation of the most recent earlier
occurrence of the sequence's last n tokens is proposed (code and chat repeat themselves a lot), and
the target verifies it through the same batched path as draft-model speculation."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tandem.engine.sequence import Sequence
from tandem.engine.speculation import Proposal, StepFeedback
from tandem.optimize.checks import integer_in, no_speculator_yet
from tandem.optimize.types import OptimizedModel

__all__ = ["NgramSpeculator", "Ngram", "lookup"]


def lookup(ids: list[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Up to k tokens that followed the latest earlier match of ids' last n tokens (longest n first)."""
    length = len(ids)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        pattern = ids[length - n :]
        first = pattern[0]
        # Scan backwards so the most recent occurrence wins; the match must end before the suffix.
        for start in range(length - n - 1, -1, -1):
            if ids[start] == first and ids[start : start + n] == pattern:
                return ids[start + n : start + n + k]
    return []


@dataclass
class NgramSpeculator:
    k: int = 4
    max_batch: int = 64
    n_max: int = 3
    n_min: int = 1

    def bind(self, num_slots: int, max_len: int) -> None:
        pass

    def draft_lengths(self, seqs: list[Sequence], num_prefill_tokens: int = 0) -> list[int]:
        return [self.k if len(seqs) <= self.max_batch else 0] * len(seqs)

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> list[Proposal]:
        return [Proposal(lookup(seq.all_ids, k, self.n_max, self.n_min)) for seq, k in zip(seqs, lengths, strict=True)]

    def observe(self, feedback: StepFeedback) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass


@dataclass(frozen=True)
class Ngram:
    # Measured on held-out code (benchmarks/results/speculative_bundled.json): 1.9x at batch 1,
    # 1.3x at 2, even at 4, 0.8x at 8: off above 4 decoding rows.
    k: int = 4
    n: int = 3
    max_batch: int = 4
    name: str = "ngram"
    version: str = "1.0"
    description: str = "prompt-lookup speculation: propose the continuation of an earlier n-gram match"

    def __post_init__(self) -> None:
        integer_in("ngram", "k", self.k, 1, 16)
        integer_in("ngram", "n", self.n, 1, 8)
        integer_in("ngram", "max_batch", self.max_batch, 1)

    def with_params(self, **params) -> Ngram:
        return replace(self, **params)

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        no_speculator_yet("ngram", model)
        return model.with_changes(speculator=NgramSpeculator(self.k, self.max_batch, self.n))
