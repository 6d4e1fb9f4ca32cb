"""ProcessorTables: what a request's logits processors need, computed once per request, not per step.

A request's bad words, logit_bias, stop_token_ids and EOS become tensors and lookup tables when it
arrives (the server builds them in a worker thread, off the event loop and off the engine thread,
and shares them between the request's n choices); each engine step then costs, per row:

- bad words: one dict lookup per distinct word length (at most MAX_BAD_WORD_TOKENS), then the
  precomputed ids of the banned last tokens; one-token words are one precomputed tensor;
- min_tokens: one precomputed tensor of EOS and the stop ids (deduplicated);
- logit_bias: two precomputed tensors (ids, values).

So a request with 256 bad words or 1,024 biases costs a step a few tensor concatenations, never a
Python loop over its words or entries (tandem.engine.processors applies them; benchmarks/
bench_processors.py measures it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import torch

from tandem.engine.sampling_params import SamplingParams

__all__ = ["MAX_BAD_WORD_TOKENS", "BadWordError", "ProcessorTables", "bad_words_token_ids", "prepare_tables"]

# A bad word is a word or a short phrase; one this long is a probe, and each distinct length costs
# every step a lookup.
MAX_BAD_WORD_TOKENS = 64

_NO_IDS = torch.empty(0, dtype=torch.long)


class BadWordError(ValueError):
    """A bad word past the bounds; the message names bad_words."""


def bad_words_token_ids(words: Iterable[str], encode: Callable[[str], list[int]]) -> tuple[tuple[int, ...], ...]:
    """The token sequences that spell each word, as vLLM derives them: the word itself (stripped of
    leading spaces), and with one leading space when that tokenizes to a different first token but
    as many tokens (the word in the middle of text). `encode` adds no special tokens."""
    out: list[tuple[int, ...]] = []
    for word in words:
        bare = tuple(encode(word.lstrip()))
        if not bare:
            continue
        out.append(bare)
        spaced = tuple(encode(" " + word.lstrip()))
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return tuple(out)


def _ids(values: Iterable[int]) -> torch.Tensor:
    values = sorted(set(values))
    return torch.tensor(values, dtype=torch.long) if values else _NO_IDS


@dataclass(frozen=True, eq=False)
class ProcessorTables:
    always_banned: torch.Tensor  # long [k]: one-token bad words
    # (prefix length p, {the last p output tokens: the last tokens of the words they begin}), p ascending
    after_prefix: tuple[tuple[int, dict[tuple[int, ...], torch.Tensor]], ...]
    min_tokens_banned: torch.Tensor  # long [k]: EOS and stop_token_ids, banned before min_tokens
    bias_ids: torch.Tensor  # long [k]
    bias_values: torch.Tensor  # float32 [k]
    max_id: int  # the largest id in any table (-1: none); a smaller (draft) vocabulary drops those beyond it

    @classmethod
    def build(
        cls, params: SamplingParams, eos_ids: Collection[int], bad_word_ids: Iterable[Iterable[int]] = ()
    ) -> ProcessorTables:
        single: set[int] = set()
        grouped: dict[int, dict[tuple[int, ...], set[int]]] = defaultdict(lambda: defaultdict(set))
        for word in bad_word_ids:
            word = tuple(word)
            if len(word) == 1:
                single.add(word[0])
            elif word:
                grouped[len(word) - 1][word[:-1]].add(word[-1])
        after_prefix = tuple(
            (length, {prefix: _ids(last) for prefix, last in table.items()})
            for length, table in sorted(grouped.items())
        )
        banned = set(params.stop_token_ids) | set(eos_ids) if params.min_tokens else set()
        bias = dict(params.logit_bias)
        ids = [*single, *banned, *bias, *(t for _, table in grouped.items() for v in table.values() for t in v)]
        return cls(
            always_banned=_ids(single),
            after_prefix=after_prefix,
            min_tokens_banned=_ids(banned),
            bias_ids=torch.tensor(list(bias), dtype=torch.long) if bias else _NO_IDS,
            bias_values=torch.tensor(list(bias.values()), dtype=torch.float32),
            max_id=max(ids, default=-1),
        )

    def banned(self, output: list[int], min_tokens: int) -> list[torch.Tensor]:
        """The ids banned after `output` (one row's history): a few precomputed tensors."""
        out = [self.always_banned] if len(self.always_banned) else []
        n = len(output)
        for length, table in self.after_prefix:
            if length > n:
                break
            last = table.get(tuple(output[n - length :]))
            if last is not None:
                out.append(last)
        if n < min_tokens and len(self.min_tokens_banned):
            out.append(self.min_tokens_banned)
        return out


def prepare_tables(
    params: SamplingParams, eos_ids: Collection[int], encode: Callable[[str], list[int]]
) -> ProcessorTables:
    """Tokenize params.bad_words (as vLLM) and build the tables. BadWordError for a word over
    MAX_BAD_WORD_TOKENS tokens. Touches no engine state: safe from any thread."""
    words: list[tuple[int, ...]] = []
    for index, word in enumerate(params.bad_words):
        spelled = bad_words_token_ids([word], encode)
        longest = max((len(w) for w in spelled), default=0)
        if longest > MAX_BAD_WORD_TOKENS:
            raise BadWordError(
                f"bad_words[{index}]: {longest} tokens; a bad word may have at most {MAX_BAD_WORD_TOKENS} tokens"
            )
        words += spelled
    return ProcessorTables.build(params, eos_ids, words)
