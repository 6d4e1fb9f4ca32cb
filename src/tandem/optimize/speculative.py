"""`speculative`: draft-model speculative decoding inside continuous batching.

A small draft model with the target's tokenizer proposes k tokens per running sequence; the engine
verifies them for all rows in one target forward (tandem.engine.speculation). The draft keeps its
own KV cache in the same slot numbers as the target's and catches up lazily: before proposing, it
feeds whatever tokens of the sequence it has not seen (the prompt once, then the 1-2 tokens the last
verification committed), so rejected proposals cost nothing to undo.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from tandem.data.bundled import bundled_draft_dir
from tandem.engine.grammar_mask import apply_grammars
from tandem.engine.model_runner import ModelRunner
from tandem.engine.processors import LogitsRow, process_logits
from tandem.engine.sampler import filtered_probs
from tandem.engine.sequence import Sequence
from tandem.engine.speculation import Proposal, StepFeedback
from tandem.model.loader import Model, load_model
from tandem.optimize.checks import integer_in, no_speculator_yet
from tandem.optimize.types import OptimizedModel

__all__ = ["DraftModelSpeculator", "Speculative", "default_draft_dir", "load_draft"]


def default_draft_dir() -> Path:
    return bundled_draft_dir()


def load_draft(path: str | None, target: Model, who: str = "speculative") -> Model:
    """The draft model (default: the bundled draft); it must share the target's vocabulary."""
    draft = load_model(path or default_draft_dir())
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"{who}: draft vocabulary ({draft.config.vocab_size}) differs from the target's "
            f"({target.config.vocab_size}); the draft must share the target's tokenizer"
        )
    return draft


@dataclass
class _DraftState:
    ids: list[int]  # tokens whose keys/values are in the draft's slot, in order
    verified: int  # prefix length known to agree with the sequence


@dataclass
class DraftModelSpeculator:
    draft: Model
    k: int = 4
    max_batch: int = 4
    runner: ModelRunner | None = None
    states: dict[str, _DraftState] = field(default_factory=dict)

    def bind(self, num_slots: int, max_len: int) -> None:
        self.runner = ModelRunner.with_slots(self.draft.module, num_slots, max_len)

    def release(self, seq: Sequence) -> None:
        self.states.pop(seq.request_id, None)

    def _valid_prefix(self, seq: Sequence, ids: list[int]) -> int:
        state = self.states.get(seq.request_id)
        if state is None:
            return 0
        valid = state.verified
        limit = min(len(state.ids), len(ids))
        while valid < limit and state.ids[valid] == ids[valid]:
            valid += 1
        return valid

    def _catch_up(self, seqs: list[Sequence]) -> torch.Tensor:
        """Feed each row's unseen tokens (a whole prompt, or the 1-2 tokens the last verification
        committed) in one ragged forward; return the draft's logits after each row's last token."""
        assert self.runner is not None, "bind() must run before propose()"
        all_ids = [s.all_ids for s in seqs]
        valid = [self._valid_prefix(s, ids) for s, ids in zip(seqs, all_ids, strict=True)]
        # At least the last token is fed again: its logits are what the first proposal comes from.
        valid = [min(v, len(ids) - 1) for v, ids in zip(valid, all_ids, strict=True)]
        rows = [ids[v:] for ids, v in zip(all_ids, valid, strict=True)]
        return self.runner.forward(rows, [self.runner.slot_table(s.slot) for s in seqs], valid, last_only=True)

    def draft_lengths(self, seqs: list[Sequence], num_prefill_tokens: int = 0) -> list[int]:
        return [self.k if len(seqs) <= self.max_batch else 0] * len(seqs)

    def observe(self, feedback: StepFeedback) -> None:
        pass

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> list[Proposal]:
        """Up to lengths[i] tokens for row i: one catch-up forward, then one forward per further
        token, over the rows still drafting."""
        logits = self._catch_up(seqs)
        tokens: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active = list(range(len(seqs)))  # rows drafting this round; logits[j] is active[j]'s
        for step in range(max(lengths)):
            # The request's processors (penalties, bans) on the draft too, so it proposes what the
            # target will keep; verification is exact either way.
            rows = [LogitsRow(seqs[i], tuple(tokens[i])) for i in active]
            # and the grammar's mask, so a constrained row proposes only tokens the grammar allows
            logits = apply_grammars(process_logits(logits, rows), rows)
            for j, i in enumerate(active):
                seq = seqs[i]
                if seq.params.greedy:
                    tokens[i].append(int(logits[j].argmax()))
                else:  # sample from the draft's own filtered distribution q; verification needs q
                    q = filtered_probs(logits[j], seq.params)
                    tokens[i].append(int(torch.multinomial(q, 1, generator=seq.generator).item()))
                    probs[i].append(q)
            active = [i for i in active if lengths[i] > step + 1]
            if not active:
                break
            starts = [seqs[i].length + step for i in active]
            logits = self.runner.forward(
                [[tokens[i][-1]] for i in active], [self.runner.slot_table(seqs[i].slot) for i in active], starts, True
            )
        proposals = []
        for i, seq in enumerate(seqs):
            # The draft's cache now holds the sequence plus all but the last proposal.
            self.states[seq.request_id] = _DraftState(seq.all_ids + tokens[i][:-1], seq.length)
            q = torch.stack(probs[i]) if probs[i] else None
            proposals.append(Proposal(tokens[i], q))
        return proposals


@dataclass(frozen=True)
class Speculative:
    # Defaults measured on the bundled pair (benchmarks/results/speculative_bundled.json): k=3 gives
    # 1.87x baseline at batch 1 and 1.19x at 2, breaks even at 4 rows and loses beyond, so
    # speculation switches off above 3 decoding rows.
    k: int = 3
    draft: str | None = None  # draft model directory; default: the bundled draft
    max_batch: int = 3
    name: str = "speculative"
    version: str = "1.0"
    description: str = "draft-model speculative decoding, verified in one batched target forward (lossless)"

    def __post_init__(self) -> None:
        integer_in("speculative", "k", self.k, 1, 16)
        integer_in("speculative", "max_batch", self.max_batch, 1)

    def with_params(self, **params) -> Speculative:
        return replace(self, **params)

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        no_speculator_yet("speculative", model)
        draft = load_draft(self.draft, model.model)
        speculator = DraftModelSpeculator(draft, self.k, self.max_batch)
        return model.with_changes(speculator=speculator, notes=(*model.notes, f"draft={draft.path}"))
