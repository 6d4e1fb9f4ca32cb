"""ProcessorTables: what a request's logits processors need, computed once per request, not per step.

A request's bad words, logit_bias, stop_token_ids and EOS become tensors and lookup tables when it
arrives (the server builds them in a worker thread, off the event loop and off the engine thread,
and shares them between the request's n choices); each engine step then costs, per row:

- bad words: one dict lookup per distinct word length (at most MAX_BAD_WORD_TOKENS), then the
  precomputed ids of the banned last tokens; one-token words are a precomputed mask;
- min_tokens: a precomputed mask of EOS and the stop ids;
- logit_bias: a precomputed dense vector;
and the masks and the bias apply to all the rows of one request in one tensor operation.

So a request with 256 bad words, 1,024 biases or a whole vocabulary of stop ids costs a step a few
tensor operations over its rows (as large as the logits themselves), never a Python loop over its
words or entries (tandem.engine.processors applies them; benchmarks/
bench_processors.py measures it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import torch

from tandem.engine.errors import RequestError
from tandem.engine.sampling_params import SamplingParams

__all__ = ["MAX_BAD_WORD_TOKENS", "BadWordError", "ProcessorTables", "bad_words_token_ids", "prepare_tables"]

# A bad word is a word or a short phrase; one this long is a probe, and each distinct length costs
# every step a lookup.
MAX_BAD_WORD_TOKENS = 64

_NO_IDS = torch.empty(0, dtype=torch.long)


class BadWordError(RequestError):
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


def _mask(ids: Collection[int], size: int) -> torch.Tensor | None:
    if not ids:
        return None
    mask = torch.zeros(size, dtype=torch.bool)
    mask[list(ids)] = True
    return mask


@dataclass(frozen=True, eq=False)
class ProcessorTables:
    size: int  # the dense tables cover ids [0, size); a smaller (draft) vocabulary uses their start
    bias: torch.Tensor | None  # float32 [size]: logit_bias, dense (added to every row of the request)
    always_banned: torch.Tensor | None  # bool [size]: one-token bad words
    min_tokens_banned: torch.Tensor | None  # bool [size]: EOS and stop_token_ids, banned before min_tokens
    # (prefix length p, {the last p output tokens: the last tokens of the words they begin}), p ascending
    after_prefix: tuple[tuple[int, dict[tuple[int, ...], torch.Tensor]], ...]

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
        banned = set(params.stop_token_ids) | set(eos_ids) if params.min_tokens else set()
        bias = dict(params.logit_bias)
        size = 1 + max([*single, *banned, *bias], default=-1)
        dense_bias = None
        if bias:
            dense_bias = torch.zeros(size, dtype=torch.float32)
            dense_bias[list(bias)] = torch.tensor(list(bias.values()), dtype=torch.float32)
        return cls(
            size=size,
            bias=dense_bias,
            always_banned=_mask(single, size),
            min_tokens_banned=_mask(banned, size),
            after_prefix=tuple(
                (length, {prefix: _ids(last) for prefix, last in table.items()})
                for length, table in sorted(grouped.items())
            ),
        )

    def prefix_bans(self, output: list[int]) -> list[torch.Tensor]:
        """The last tokens of the bad words whose other tokens `output` (one row's history) ends with."""
        if not self.after_prefix:
            return []
        out = []
        tail = tuple(output[-self.after_prefix[-1][0] :])  # as long as the longest prefix: one copy
        n = len(tail)
        for length, table in self.after_prefix:
            if length > n:
                break
            last = table.get(tail[n - length :])
            if last is not None:
                out.append(last)
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
