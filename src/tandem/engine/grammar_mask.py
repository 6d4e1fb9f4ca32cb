"""The grammar mask over a batch of logits rows: tokens a row's grammar forbids get -inf.

Runs after the other logits processors (tandem.engine.processors), on the same rows: plain rows and
each verified row's k + 1 positions. A verified position j is masked by the grammar's state after
the row's first j draft tokens, so a draft token the grammar forbids has probability 0 under the
target and verification rejects it (greedy: it is not the argmax; sampled: p(x) = 0). The drafts
advance the matcher only while computing the masks and are rolled back; the tokens verification
keeps advance it in Sequence.append. Greedy output is therefore the same with and without
speculation under a grammar, as without one.

One bitmask [rows, vocab / 32] is filled by the matchers (llguidance writes it in place), unpacked
to booleans and applied in one masked_fill. A position's mask is computed once per step: the draft
model's proposals mask positions 0 .. k - 1 of a row, and verification reuses them
(GrammarState.masks, cleared by every kept token), so a speculative row costs k + 1 masks, not 2k + 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tandem.engine.processors import LogitsRow

__all__ = ["apply_grammars"]


def apply_grammars(logits: torch.Tensor, rows: Sequence[LogitsRow], raw: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] (processed; row i predicts after rows[i]'s history) -> with grammar masks applied.
    `raw` is the unprocessed tensor: when logits is that very tensor it is copied, never written.
    A draft model's logits go through here too (its proposals then keep to the grammar)."""
    constrained = [i for i, row in enumerate(rows) if row.seq.grammar is not None]
    if not constrained:
        return logits
    vocab = logits.shape[-1]
    grammar_vocab = rows[constrained[0]].seq.grammar.vocab_size
    words = (grammar_vocab + 31) // 32
    bitmask = torch.zeros((len(constrained), words), dtype=torch.int32)
    consumed: dict[int, int] = {}  # id(seq) -> draft tokens fed to its matcher so far
    dead: set[int] = set()  # sequences whose drafts the grammar refused (their later rows are never used)
    for k, i in enumerate(constrained):
        row = rows[i]
        state, key = row.seq.grammar, id(row.seq)
        drafted = tuple(row.drafted)
        known = state.masks.get(drafted)  # the draft model's mask of this very position, this step
        if known is not None:
            bitmask[k] = torch.from_numpy(known)
            continue
        done = consumed.get(key, 0)
        if key not in dead and done < len(drafted):
            taken = state.advance(list(drafted[done:]))
            if done + taken < len(drafted):
                dead.add(key)
            done += taken
        consumed[key] = done
        if key in dead:
            bitmask[k] = -1  # never read: verification stops at the refused draft token
        else:
            state.write_mask(bitmask[k].data_ptr(), words * 4)
            state.masks[drafted] = bitmask[k].numpy().copy()
    for i in {id(rows[i].seq): i for i in constrained}.values():
        rows[i].seq.grammar.rollback(consumed.get(id(rows[i].seq), 0))
    # Bit t of word w is token 32 w + t: little-endian bytes, each unpacked least significant bit first.
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
    allowed = torch.from_numpy(bits).bool()
    if allowed.shape[1] < vocab:  # ids beyond the tokenizer's vocabulary: never allowed
        allowed = torch.cat([allowed, allowed.new_zeros((len(constrained), vocab - allowed.shape[1]))], dim=1)
    forbidden = ~allowed[:, :vocab]
    if raw is None or logits is raw:
        logits = logits.clone()
    if len(constrained) == len(rows):
        logits.masked_fill_(forbidden, float("-inf"))
        masked = logits
    else:
        index = torch.tensor(constrained, dtype=torch.long)
        masked = logits[index].masked_fill_(forbidden, float("-inf"))
    # A row whose other processors banned every token the grammar allows (min_tokens against a
    # complete output: EOS only): the grammar wins. Only rows with processors can be so.
    processed = [k for k, i in enumerate(constrained) if rows[i].seq.params.processes_logits]
    if processed:
        check = torch.tensor(processed, dtype=torch.long)
        empty = check[torch.isinf(masked[check]).all(dim=-1)]
        if len(empty):
            masked[empty] = torch.zeros_like(masked[empty]).masked_fill_(forbidden[empty], float("-inf"))
    if masked is not logits:
        logits[index] = masked
    return logits
