"""Forced tokens as drafts: where a row's grammar admits only one way on (a JSON schema's `","age":`
between two fields, a closing `"}`), those tokens join the row's proposal and are verified with it in
the step's one forward, instead of costing a step each (jump-forward decoding, lossless).

They are drafts like any speculator's: verified against the target's masked logits, so greedy output
is exactly the same as one token a step (a forced token is accepted only where it is the target's
argmax; the grammar forces the text, and the target may still prefer another tokenization of it), and
a sampled row keeps the target's distribution (a forced token is a point-mass draft, accepted with
probability p(x)). They follow the speculator's own proposal (the grammar's forced tokens after it),
or stand alone on a row the speculator left plain or on a recipe without one.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from tandem.engine.sequence import Sequence
from tandem.engine.speculation import Proposal

__all__ = ["MAX_FORCED", "with_forced_tokens"]

MAX_FORCED = 16  # forced tokens added to one row in one step


def with_forced_tokens(
    seqs: Seq[Sequence], proposals: list[Proposal | None], room: Seq[int], limit: int = MAX_FORCED
) -> tuple[list[Proposal | None], int]:
    """Each constrained row's proposal extended by the tokens its grammar forces after it, the whole
    proposal at most room[i] tokens (the slot's and max_tokens' room). Returns (proposals, tokens added)."""
    out = list(proposals)
    added = 0
    for i, seq in enumerate(seqs):
        grammar = seq.grammar
        if grammar is None:
            continue
        proposal = out[i]
        drafted = proposal.tokens if proposal is not None else []
        want = min(limit, room[i] - len(drafted))
        if want <= 0:
            continue
        forced = grammar.forced_after(list(drafted), want)
        if not forced:
            continue
        probs = proposal.probs if proposal is not None else None
        if probs is not None:  # a sampled draft's q, and a point mass at each forced token
            point = probs.new_zeros((len(forced), probs.shape[-1]))
            point[torch.arange(len(forced)), torch.tensor(forced)] = 1.0
            probs = torch.cat([probs, point])
        out[i] = Proposal([*drafted, *forced], probs)
        added += len(forced)
    return out, added
