"""Speculative decoding inside continuous batching: propose, verify in one batched forward, accept.

A Speculator (draft model, n-gram lookup, ... supplied by the optimization layer) first says how many
tokens to draft for each decoding row this step (0: decode that row plainly; a fixed k up to a batch
size, or a length chosen from measured acceptance and costs), then proposes up to that many. The
target then scores, for all rows at once, the last accepted token followed by the k proposals: k + 1
tokens per row, in the same ragged forward as the step's prompt chunks and the rows that got no
proposal (tandem.engine.engine). Acceptance is lossless:
- greedy rows keep proposals while they equal the target's argmax, then add the target's own token;
- sampled rows use rejection sampling (Leviathan et al. 2023): accept proposal x with probability
  min(1, p(x) / q(x)); on the first rejection sample from norm(max(0, p - q)); if all k are accepted,
  sample a bonus token from p. The output then has exactly the target's distribution p, where p and
  q are the request's own filtered distributions (temperature, min-p, top-k, top-p).
Both compare against the target's processed logits (penalties, biases, bans:
tandem.engine.processors, applied per position with the proposals before it as history), the very
distribution plain decoding samples from.
Every row therefore gains between 1 and k + 1 tokens per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tandem.engine.outputs import TokenLogprob
from tandem.engine.sampler import _logprob_entry, filtered_probs
from tandem.engine.sequence import Sequence

__all__ = ["Speculator", "Proposal", "StepFeedback", "draft", "verify"]


@dataclass
class Proposal:
    tokens: list[int]  # proposed continuation (may be shorter than k, or empty)
    probs: torch.Tensor | None = None  # [len(tokens), V] draft distribution q per token; None = point mass


@dataclass(frozen=True)
class StepFeedback:
    """What one step's verification found, for speculators that adapt (per verified row)."""

    seqs: list[Sequence]
    drafted: list[int]  # tokens proposed to each row
    accepted: list[int]  # of those, accepted by the target
    num_decode_rows: int  # decoding rows in the step (verified or not)
    num_tokens: int  # flat tokens the step's target forward ran (prompt chunks included)
    step_seconds: float  # the step's time on the engine's clock, less the speculator's own drafting


class Speculator(Protocol):
    """Proposes draft tokens for running sequences. Implementations keep whatever state they need
    (a draft model's KV cache in the same slots as the target's) and are told about every outcome."""

    def bind(self, num_slots: int, max_len: int) -> None: ...

    def draft_lengths(self, seqs: list[Sequence], num_prefill_tokens: int) -> list[int]:
        """Tokens to draft for each decoding row this step (0: decode it plainly); the step also
        runs num_prefill_tokens prompt tokens in the same forward."""
        ...

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> list[Proposal]:
        """Up to lengths[i] tokens for row i (each >= 1)."""
        ...

    def observe(self, feedback: StepFeedback) -> None:
        """After every step with decoding rows: verification outcomes (if any) and the step's cost."""
        ...

    def release(self, seq: Sequence) -> None: ...


def verify(
    seqs: list[Sequence],
    proposals: list[Proposal],
    logits: torch.Tensor | list[torch.Tensor],
    raw_logits: torch.Tensor | list[torch.Tensor] | None = None,
) -> list[tuple[list[int], list[TokenLogprob | None]]]:
    """Accept or reject each row's proposals against the target's processed logits: [B, k + 1, V],
    or one [len(proposal) + 1, V] tensor per row.

    Row i's logits[i][j] is the target's prediction after the last accepted token and the first j
    proposals. Returns, per row, the tokens to append (accepted proposals + one target token) and
    their logprobs where the request asked for them (from raw_logits, the model's own; default: logits).
    """
    raw_logits = logits if raw_logits is None else raw_logits
    results = []
    for row, (seq, proposal) in enumerate(zip(seqs, proposals, strict=True)):
        params, draft = seq.params, proposal.tokens
        row_logits = logits[row][: len(draft) + 1]
        if params.greedy:
            target = row_logits.argmax(-1).tolist()
            accepted = 0
            while accepted < len(draft) and draft[accepted] == target[accepted]:
                accepted += 1
            tokens = draft[:accepted] + [target[accepted]]
        else:
            p = filtered_probs(row_logits, params)  # [len(draft) + 1, V]
            tokens = []
            for j, x in enumerate(draft):
                q_x = 1.0 if proposal.probs is None else float(proposal.probs[j, x])
                u = torch.rand((), generator=seq.generator).item()
                if u * q_x <= float(p[j, x]):  # accept with probability min(1, p/q)
                    tokens.append(x)
                    continue
                # Rejected: the residual max(0, p - q) holds exactly the mass plain sampling would
                # have put elsewhere.
                q = torch.zeros_like(p[j]) if proposal.probs is None else proposal.probs[j]
                if proposal.probs is None:
                    q[x] = 1.0
                residual = (p[j] - q).clamp_min(0)
                total = residual.sum()
                dist = residual / total if total > 0 else p[j]
                tokens.append(int(torch.multinomial(dist, 1, generator=seq.generator).item()))
                break
            else:  # every proposal accepted: a bonus token from the target's last position
                tokens.append(int(torch.multinomial(p[len(draft)], 1, generator=seq.generator).item()))
        logprobs: list[TokenLogprob | None] = [None] * len(tokens)
        if params.logprobs is not None:
            lp = torch.log_softmax(raw_logits[row][: len(tokens)], dim=-1)
            logprobs = [_logprob_entry(lp[j], t, params.logprobs) for j, t in enumerate(tokens)]
        results.append((tokens, logprobs))
    return results


def draft(
    spec: Speculator | None, decode: list[Sequence], num_prefill_tokens: int, room: list[int]
) -> list[Proposal | None]:
    """The step's drafts: for the decoding rows `spec` picks, at most `room[i]` tokens each (None: the
    row decodes plainly); a constrained row's draft is cut at the first token its grammar forbids."""
    proposals: list[Proposal | None] = [None] * len(decode)
    if not decode or spec is None:
        return proposals
    lengths = spec.draft_lengths(decode, num_prefill_tokens)
    lengths = [min(k, r) for k, r in zip(lengths, room, strict=True)]
    rows = [i for i, k in enumerate(lengths) if k > 0]
    if rows:
        drafted = spec.propose([decode[i] for i in rows], [lengths[i] for i in rows])
        for i, proposal in zip(rows, drafted, strict=True):
            grammar = decode[i].grammar
            if grammar is not None and proposal.tokens:
                # Drafts past the first token the grammar forbids would be rejected anyway: not
                # verified at all (an n-gram lookup knows nothing of the grammar).
                keep = grammar.valid_prefix(proposal.tokens)
                probs = proposal.probs[:keep] if proposal.probs is not None else None
                proposal = Proposal(proposal.tokens[:keep], probs)
            proposals[i] = proposal if proposal.tokens else None
    return proposals
