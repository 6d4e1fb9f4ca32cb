"""Logits processors: what a request's history does to its next-token logits, for many rows at once.

Plain sampling and speculative verification both go through `process_logits`. A row of logits is
the target's prediction after a sequence's output so far plus, when verifying, the draft tokens
before that position; the processors see exactly that history. So the distribution drafts are
verified against is the one plain decoding samples from, and greedy output with penalties is the
same with and without speculation, solo and batched.

Definitions and order are vLLM's (OpenAI's for the presence and frequency penalties):
1. bad_words: a one-token word is banned everywhere; a longer one's last token is banned where the
   output ends with the rest of it (vLLM's NoBadWordsLogitsProcessor, over output tokens);
2. min_tokens: EOS and stop_token_ids are banned while the output is shorter than min_tokens;
3. logit_bias is added;
4. repetition_penalty over prompt and output tokens (positive logits divided by it, negative ones
   multiplied), then frequency_penalty x count and presence_penalty x (count > 0) over output
   tokens are subtracted.
A ban is -inf, which no later step lifts, so bans are written last. Temperature, min_p, top-k and
top-p follow in the sampler (tandem.engine.sampler). Each processor is one tensor operation over
every row that uses it, with per-row parameters; rows that use none cost nothing. What bad words,
logit_bias, min_tokens and stop_token_ids need is precomputed once per request
(tandem.engine.processor_tables), so their cost per step does not grow with their size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.engine.processor_tables import ProcessorTables, bad_words_token_ids
from tandem.engine.sequence import Sequence as EngineSequence

__all__ = ["LogitsRow", "bad_words_token_ids", "process_logits", "tables_of"]


@dataclass(frozen=True)
class LogitsRow:
    """A row of logits: the prediction after seq's output followed by `drafted` (proposals under verification)."""

    seq: EngineSequence
    drafted: tuple[int, ...] = ()

    @property
    def output_ids(self) -> list[int]:
        return self.seq.output_ids + list(self.drafted) if self.drafted else self.seq.output_ids


def tables_of(seq: EngineSequence) -> ProcessorTables:
    """The sequence's precomputed tables (tandem.engine.processor_tables), built now if it came without."""
    if seq.tables is None:
        seq.tables = ProcessorTables.build(seq.params, seq.eos_ids, seq.bad_word_ids)
    return seq.tables


def _index(pairs: list[tuple[int, int]], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Ids beyond this vocabulary (a draft model's smaller one) are dropped.
    kept = [(r, t) for r, t in pairs if t < vocab]
    rows = torch.tensor([r for r, _ in kept], dtype=torch.long)
    return rows, torch.tensor([t for _, t in kept], dtype=torch.long)


def _gather(parts: list[tuple[int, torch.Tensor]], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, id) index tensors of each row's id tensors, ids beyond this vocabulary dropped."""
    ids = torch.cat([t for _, t in parts])
    rows = torch.repeat_interleave(
        torch.tensor([r for r, _ in parts], dtype=torch.long), torch.tensor([len(t) for _, t in parts])
    )
    if ids.numel() and int(ids.max()) >= vocab:
        keep = ids < vocab
        rows, ids = rows[keep], ids[keep]
    return rows, ids


def _penalize(logits: torch.Tensor, rows: list[LogitsRow], which: list[int]) -> None:
    """Repetition, frequency and presence penalties for the rows `which`, in place, in one pass."""
    vocab = logits.shape[-1]
    params = [rows[i].seq.params for i in which]
    generated = [(j, t) for j, i in enumerate(which) for t in rows[i].output_ids]
    repeating = [(j, i) for j, i in enumerate(which) if params[j].repetition_penalty != 1.0]
    prompt = [(j, t) for j, i in repeating for t in rows[i].seq.prompt_ids]
    counts = torch.zeros((len(which), vocab), dtype=logits.dtype)
    out_rows, out_ids = _index(generated, vocab)
    counts.index_put_((out_rows, out_ids), torch.ones(len(out_ids), dtype=logits.dtype), accumulate=True)
    seen = counts > 0
    seen_prompt = torch.zeros_like(seen)
    seen_prompt[_index(prompt, vocab)] = True
    column = lambda values: torch.tensor(values, dtype=logits.dtype)[:, None]  # noqa: E731
    repetition = column([p.repetition_penalty for p in params])
    sub = logits[which]
    sub = torch.where(seen | seen_prompt, torch.where(sub > 0, sub / repetition, sub * repetition), sub)
    sub -= column([p.frequency_penalty for p in params]) * counts
    sub -= column([p.presence_penalty for p in params]) * seen
    logits[which] = sub


class _Request:
    """The rows of one request's tables in this batch (its choices share them)."""

    def __init__(self, tables: ProcessorTables) -> None:
        self.tables = tables
        self.rows: list[int] = []
        self.before_min_tokens: list[int] = []


def _apply(logits: torch.Tensor, rows: list[int], size: int, change) -> None:
    """change(sub) on logits[rows, :size] (the dense tables cover ids below `size`), in place."""
    width = min(size, logits.shape[-1])
    index = torch.tensor(rows, dtype=torch.long)
    sub = logits[index, :width]
    change(sub, width)
    logits[index, :width] = sub


def process_logits(logits: torch.Tensor, rows: Sequence[LogitsRow]) -> torch.Tensor:
    """logits [N, V] (row i predicts after rows[i]'s history) -> the processed logits; the input is
    returned unchanged (not copied) when no row uses a processor."""
    active = [i for i, row in enumerate(rows) if row.seq.params.processes_logits]
    if not active:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    requests: dict[int, _Request] = {}
    prefix_banned: list[tuple[int, torch.Tensor]] = []
    penalized: list[int] = []
    for i in active:
        row = rows[i]
        params, tables = row.seq.params, tables_of(row.seq)
        request = requests.get(id(tables))
        if request is None:
            request = requests[id(tables)] = _Request(tables)
        request.rows.append(i)
        output = row.output_ids
        if len(output) < params.min_tokens:
            request.before_min_tokens.append(i)
        prefix_banned += [(i, ids) for ids in tables.prefix_bans(output)]
        if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
            penalized.append(i)
    inf = float("-inf")
    for r in requests.values():
        if r.tables.bias is not None:
            _apply(logits, r.rows, r.tables.size, lambda sub, w, b=r.tables.bias: sub.add_(b[:w].to(sub.dtype)))
    if penalized:
        _penalize(logits, list(rows), penalized)
    for r in requests.values():  # bans last: nothing after them may lift a -inf
        t = r.tables
        if t.always_banned is not None:
            _apply(logits, r.rows, t.size, lambda sub, w, m=t.always_banned: sub.masked_fill_(m[:w], inf))
        if t.min_tokens_banned is not None and r.before_min_tokens:
            _apply(
                logits, r.before_min_tokens, t.size, lambda sub, w, m=t.min_tokens_banned: sub.masked_fill_(m[:w], inf)
            )
    if prefix_banned:
        logits[_gather(prefix_banned, vocab)] = inf
    return logits
