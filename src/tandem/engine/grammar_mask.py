"""The grammar mask over a batch of logits rows: tokens a row's grammar forbids get -inf.

Runs after the other logits processors (tandem.engine.processors), on the same rows: plain rows and
each verified row's k + 1 positions. A verified position j is masked by the grammar's state after
the row's first j draft tokens, so a draft token the grammar forbids has probability 0 under the
target and verification rejects it (greedy: it is not the argmax; sampled: p(x) = 0). The drafts
advance the matcher only while computing the masks and are rolled back; the tokens verification
keeps advance it in Sequence.append. Greedy output is therefore the same with and without
speculation under a grammar, as without one.

One bitmask [rows, vocab / 32] is filled by the matchers (llguidance writes it in place), unpacked
to booleans and applied in one masked_fill.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tandem.engine.processors import LogitsRow

__all__ = ["apply_grammars"]

_BITS = torch.arange(32, dtype=torch.int32)


def _allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)


def apply_grammars(logits: torch.Tensor, rows: Sequence[LogitsRow], raw: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] (processed; row i predicts after rows[i]'s history) -> with grammar masks applied.
    `raw` is the unprocessed tensor: when logits is that very tensor it is copied, never written."""
    constrained = [i for i, row in enumerate(rows) if row.seq.grammar is not None]
    if not constrained:
        return logits
    vocab = logits.shape[-1]
    words = (vocab + 31) // 32
    bitmask = torch.zeros((len(constrained), words), dtype=torch.int32)
    nbytes = words * 4
    consumed: dict[int, int] = {}  # id(seq) -> draft tokens fed to its matcher so far
    dead: set[int] = set()  # sequences whose drafts the grammar already refused (later rows are never used)
    previous: dict[int, int] = {}  # id(seq) -> its last row in bitmask
    for k, i in enumerate(constrained):
        row = rows[i]
        state, key = row.seq.grammar, id(row.seq)
        done = consumed.get(key, 0)
        while key not in dead and done < len(row.drafted):
            token = row.drafted[done]
            if not _allowed(bitmask, previous[key], token) or not state.consume(token):
                dead.add(key)
                break
            done += 1
        consumed[key] = done
        if key in dead:
            bitmask[k] = -1  # never read: verification stops at the refused draft
        else:
            state.write_mask(bitmask[k].data_ptr(), nbytes)
        previous[key] = k
    for row_index in {id(rows[i].seq): i for i in constrained}.values():
        key = id(rows[row_index].seq)
        rows[row_index].seq.grammar.rollback(consumed[key])
    allowed = ((bitmask[:, :, None] >> _BITS) & 1).bool().reshape(len(constrained), -1)[:, :vocab]
    if logits is raw or raw is None:
        logits = logits.clone()
    index = torch.tensor(constrained, dtype=torch.long)
    masked = logits[index].masked_fill(~allowed, float("-inf"))
    # A row whose other processors banned every token the grammar allows (min_tokens against a
    # complete output: EOS only): the grammar wins.
    empty = torch.isinf(masked).all(dim=-1) & allowed.any(dim=-1)
    if bool(empty.any()):
        masked[empty] = torch.zeros_like(masked[empty]).masked_fill(~allowed[empty], float("-inf"))
    logits[index] = masked
    return logits
