"""Adaptive speculation: `speculative@2.0` and `ngram@2.0`, the second versions of the two speculators.

Version 1 drafts a fixed k tokens for every decoding row and switches off above a fixed batch size
(`max_batch`), both measured once on one machine. Version 2 decides every step, from what it
measures while serving (tandem.optimize.draft_length):

- the per-token acceptance of each proposal source, overall and per sequence (exponentially
  weighted; a sequence the target keeps rejecting drafts less);
- the cost of a target forward per token and of a draft forward per row (lines fitted to the
  engine's own step timings, so the choice follows the hardware, the model pair and the batch);

and drafts the k (0 to k_max) that maximizes the step's expected output tokens per second for the
current batch. Where no length pays, it decodes plainly; a source unused for `probe_every` steps
drafts at least one token, so its acceptance is measured again (the text may have become
predictable, or the other source may have been chosen on a few unlucky outcomes).

Two proposal sources: prompt lookup (the continuation of an earlier n-gram match: free, often long
in code) and the draft model (one forward per drafted token). `speculative@2.0` uses both: rows with
a lookup match take it when that plan's expected rate beats drafting every row with the model.
Either way verification is the engine's (tandem.engine.speculation): greedy output is the target's
own, and sampled output keeps the target's distribution, since the draft length is chosen before
(and independently of) the random draws it is verified with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tandem.engine.sequence import Sequence
from tandem.engine.speculation import Proposal, StepFeedback
from tandem.optimize.checks import integer_in, no_speculator_yet
from tandem.optimize.draft_length import (
    Acceptance,
    CostFit,
    LinearCost,
    choose_draft_length,
    expected_tokens,
    row_draft_lengths,
)
from tandem.optimize.ngram import lookup
from tandem.optimize.speculative import DraftModelSpeculator, load_draft
from tandem.optimize.types import OptimizedModel

__all__ = ["AdaptiveSpeculator", "AdaptiveSpeculative", "AdaptiveNgram"]

LOOKUP, DRAFT = "lookup", "draft"
# Shapes of the cost lines before any timing (scaled by the first one): a target forward of 20 more
# tokens costs about its fixed part again; a draft forward's per-row part is small (draft-sized).
TARGET_PRIOR = LinearCost(1.0, 0.05)
DRAFT_PRIOR = LinearCost(1.0, 0.03)
ROW_PRIOR_TRIALS = 4.0  # a sequence's own outcomes count against this many trials at the global rate


@dataclass
class _RowStats:
    successes: float = 0.0
    trials: float = 0.0

    def add(self, drafted: int, accepted: int, decay: float = 0.9) -> None:
        self.successes = self.successes * decay + accepted
        self.trials = self.trials * decay + accepted + (1 if accepted < drafted else 0)

    def rate(self, overall: float) -> float:
        return (overall * ROW_PRIOR_TRIALS + self.successes) / (ROW_PRIOR_TRIALS + self.trials)


@dataclass
class AdaptiveSpeculator:
    draft: DraftModelSpeculator | None  # None: prompt lookup only (ngram@2.0)
    use_lookup: bool = True
    k_max: int = 8
    n_max: int = 3
    probe_every: int = 32
    clock: Callable[[], float] = time.monotonic
    target_cost: CostFit = field(default_factory=lambda: CostFit(TARGET_PRIOR))
    draft_cost: CostFit = field(default_factory=lambda: CostFit(DRAFT_PRIOR, anchors=(1.0, 32.0)))
    acceptance: dict[str, Acceptance] = field(default_factory=lambda: {LOOKUP: Acceptance(), DRAFT: Acceptance()})
    rows: dict[str, dict[str, _RowStats]] = field(default_factory=dict)
    _planned: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # request -> (source, lookup)
    _sources: dict[str, str] = field(default_factory=dict)  # request -> source of its pending proposal
    _idle: dict[str, int] = field(default_factory=lambda: {LOOKUP: 0, DRAFT: 0})  # steps since a source drafted

    def bind(self, num_slots: int, max_len: int) -> None:
        if self.draft is not None:
            self.draft.bind(num_slots, max_len)

    def release(self, seq: Sequence) -> None:
        self.rows.pop(seq.request_id, None)
        self._sources.pop(seq.request_id, None)
        if self.draft is not None:
            self.draft.release(seq)

    # -- choosing -----------------------------------------------------------------------------

    def _rate(self, seq: Sequence, source: str) -> float:
        overall = self.acceptance[source].rate
        stats = self.rows.get(seq.request_id, {}).get(source)
        return stats.rate(overall) if stats else overall

    def draft_lengths(self, seqs: list[Sequence], num_prefill_tokens: int = 0) -> list[int]:
        self._planned = {}
        for source in self._idle:
            self._idle[source] += 1
        target, draft = self.target_cost.estimate(), self.draft_cost.estimate()
        sources = [s for s in (LOOKUP, DRAFT) if self._has(s)]
        best_possible = max(self.acceptance[s].rate for s in sources)
        # Cheap test first: if drafting cannot pay even at the best source's rate, skip the lookups.
        k_any, _ = choose_draft_length(
            [best_possible] * len(seqs), target, self._draft_line(draft), self.k_max, num_prefill_tokens
        )
        stale = [s for s in sources if self._idle[s] >= self.probe_every]
        if k_any == 0 and not stale:
            return [0] * len(seqs)
        lookups = [lookup(s.all_ids, self.k_max, self.n_max, 1) if self.use_lookup else [] for s in seqs]
        plans = {}
        if self.draft is not None:  # every row drafts with the model
            plans[DRAFT] = self._plan(seqs, [None] * len(seqs), target, draft, num_prefill_tokens)
        if any(lookups):  # rows with a match use it, the others the draft model (or decode plainly)
            plans[LOOKUP] = self._plan(seqs, lookups, target, draft, num_prefill_tokens)
        lengths, chosen = [0] * len(seqs), [DRAFT] * len(seqs)
        if plans:
            lengths, chosen, _ = max(plans.values(), key=lambda plan: plan[2])
        probe = next((s for s in stale if s in plans), None)
        if probe is not None:
            # A source unused for probe_every steps drafts at least one token per row it serves:
            # its acceptance (and for the draft model, its cost) is measured again.
            lengths, chosen, _ = plans[probe]
            lengths = [max(k, 1) if src == probe else k for k, src in zip(lengths, chosen, strict=True)]
        for seq, k, source, found in zip(seqs, lengths, chosen, lookups, strict=True):
            if k:
                self._planned[seq.request_id] = (source, found)
                self._idle[source] = 0
        return lengths

    def _has(self, source: str) -> bool:
        return self.use_lookup if source == LOOKUP else self.draft is not None

    def _draft_line(self, draft: LinearCost) -> LinearCost:
        # Lookup proposals cost no draft forward: the optimistic bound for "can anything pay?".
        return LinearCost(0.0, 0.0) if self.use_lookup or self.draft is None else draft

    def _plan(
        self, seqs: list[Sequence], lookups: list[list[int] | None], target: LinearCost, draft: LinearCost, other: int
    ) -> tuple[list[int], list[str], float]:
        """(lengths, sources, expected rate) of the best plan where rows with a lookup match use it
        and the rest draft with the model (if there is one)."""
        matched = [i for i, found in enumerate(lookups) if found]
        drafting = [i for i, found in enumerate(lookups) if not found] if self.draft is not None else []
        a_lookup = [self._rate(seqs[i], LOOKUP) for i in matched]
        a_draft = [self._rate(seqs[i], DRAFT) for i in drafting]
        plain_rows = len(seqs) - len(matched) - len(drafting)
        best = (0, 0, len(seqs) / target(other + len(seqs)))
        draft_tokens = [sum(expected_tokens(a, k) for a in a_draft) for k in range(self.k_max + 1 if drafting else 1)]
        for k_l in range(self.k_max + 1 if matched else 1):
            caps = [min(k_l, len(lookups[i])) for i in matched]
            tokens_l = sum(expected_tokens(a, c) for a, c in zip(a_lookup, caps, strict=True))
            verified_l = sum(caps) + len(matched)
            for k_d, tokens_d in enumerate(draft_tokens):
                tokens = tokens_l + tokens_d + plain_rows
                seconds = target(other + verified_l + len(drafting) * (k_d + 1) + plain_rows)
                seconds += k_d * draft(len(drafting)) if k_d else 0.0
                if tokens / seconds > best[2]:
                    best = (k_l, k_d, tokens / seconds)
        k_l, k_d, rate = best
        lengths, sources = [0] * len(seqs), [DRAFT] * len(seqs)
        per_token = target.per_unit
        for i, k in zip(matched, row_draft_lengths(a_lookup, k_l, rate, per_token), strict=True):
            lengths[i], sources[i] = min(k, len(lookups[i])), LOOKUP
        for i, k in zip(drafting, row_draft_lengths(a_draft, k_d, rate, per_token), strict=True):
            lengths[i] = k
        return lengths, sources, rate

    # -- proposing and learning -----------------------------------------------------------------

    def propose(self, seqs: list[Sequence], lengths: list[int]) -> list[Proposal]:
        proposals: list[Proposal | None] = [None] * len(seqs)
        by_draft = []
        for i, (seq, k) in enumerate(zip(seqs, lengths, strict=True)):
            source, found = self._planned.get(seq.request_id, (DRAFT, []))
            self._sources[seq.request_id] = source
            if source == LOOKUP:
                proposals[i] = Proposal(found[:k])
            else:
                by_draft.append(i)
        if by_draft:
            assert self.draft is not None, "a draft-model proposal without a draft model"
            start = self.clock()
            drafted = self.draft.propose([seqs[i] for i in by_draft], [lengths[i] for i in by_draft])
            forwards = max(lengths[i] for i in by_draft)  # one catch-up forward, then one per further token
            self.draft_cost.add(len(by_draft), (self.clock() - start) / forwards)
            for i, proposal in zip(by_draft, drafted, strict=True):
                proposals[i] = proposal
        return proposals

    def observe(self, feedback: StepFeedback) -> None:
        self.target_cost.add(feedback.num_tokens, feedback.step_seconds)
        for seq, drafted, accepted in zip(feedback.seqs, feedback.drafted, feedback.accepted, strict=True):
            source = self._sources.pop(seq.request_id, DRAFT)
            self.acceptance[source].add(drafted, accepted)
            self.rows.setdefault(seq.request_id, {}).setdefault(source, _RowStats()).add(drafted, accepted)


def _check(who: str, k_max: int, probe_every: int) -> None:
    integer_in(who, "k_max", k_max, 1, 16)
    integer_in(who, "probe_every", probe_every, 1)


@dataclass(frozen=True)
class AdaptiveSpeculative:
    k_max: int = 8
    draft: str | None = None  # draft model directory; default: the bundled draft
    lookup: bool = True  # also propose prompt-lookup continuations, where the plan's rate says they pay
    probe_every: int = 32
    name: str = "speculative"
    version: str = "2.0"
    description: str = (
        "adaptive speculative decoding: draft length per step from measured acceptance and costs at the "
        "batch's size; draft model plus prompt lookup (lossless)"
    )

    def __post_init__(self) -> None:
        _check("speculative@2.0", self.k_max, self.probe_every)

    def with_params(self, **params) -> AdaptiveSpeculative:
        return replace(self, **params)

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        no_speculator_yet("speculative", model)
        draft = load_draft(self.draft, model.model)
        speculator = AdaptiveSpeculator(
            DraftModelSpeculator(draft), self.lookup, self.k_max, probe_every=self.probe_every
        )
        return model.with_changes(speculator=speculator, notes=(*model.notes, f"draft={draft.path}"))


@dataclass(frozen=True)
class AdaptiveNgram:
    k_max: int = 8
    n: int = 3
    probe_every: int = 32
    name: str = "ngram"
    version: str = "2.0"
    description: str = "adaptive prompt-lookup speculation: length per step from measured acceptance and costs"

    def __post_init__(self) -> None:
        _check("ngram@2.0", self.k_max, self.probe_every)
        integer_in("ngram@2.0", "n", self.n, 1, 8)

    def with_params(self, **params) -> AdaptiveNgram:
        return replace(self, **params)

    def optimize(self, model: OptimizedModel) -> OptimizedModel:
        no_speculator_yet("ngram", model)
        speculator = AdaptiveSpeculator(None, True, self.k_max, self.n, probe_every=self.probe_every)
        return model.with_changes(speculator=speculator)
