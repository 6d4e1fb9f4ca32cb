"""The gate's life: SHADOWING -> PASSED / FAILED / INCONCLUSIVE -> PROMOTING -> DONE.

- SHADOWING: the mirror sends the candidate copies of live requests; `evaluate(now)` may run on
  every controller tick: it judges at checkpoints (the largest minimum sample count, then twice
  that, four times ... up to `max_samples`), at the deadline, and on a final call. Judging again
  after every pair would inflate both error rates (each look is another chance for noise to
  cross a bound), so each look reads its bounds at 1 - (1 - confidence) / looks (Bonferroni over
  the planned looks). Candidate errors are checked on every new pair: a candidate that fails
  requests is stopped at once, not at the next checkpoint.
- FAIL -> FAILED: shadowing stops, the incumbent stays.
- PASS -> PASSED; with `auto_promote` the gate goes on to PROMOTING, calls `promote(candidate)`
  (the gateway passes `Controller.use`), then DONE. Without it, `promote_now` does it on an
  operator's word. A promotion that raises ends in FAILED: the incumbent stays.
- INCONCLUSIVE while shadowing: keep shadowing, until `max_samples` pairs or `deadline_s`, or a
  final evaluation (the offline gate's end), then INCONCLUSIVE: nothing switches.
- Fail closed: a judge that raises ends in FAILED with the error as its reason.

Every transition is a Decision holding the verdict with its numbers and the evidence's summary,
kept in `decisions` and handed to `record` (e.g. a JSON-lines file). The clock comes in as data.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from tandem.gate.config import GateConfig
from tandem.gate.errors import judge_errors
from tandem.gate.evidence import Evidence, judge
from tandem.gate.pairs import PairLog
from tandem.gate.sides import Side
from tandem.gate.verdict import GateVerdict, Verdict

__all__ = ["Decision", "Gate", "GateState", "checkpoints"]

logger = logging.getLogger("tandem.gate")


def checkpoints(config: GateConfig) -> tuple[int, ...]:
    """The pair counts at which a shadowing gate judges: the largest minimum, doubling, then max_samples."""
    first = max(config.min_latency_samples, config.min_accuracy_samples, config.min_error_samples)
    points, n = [], first
    while n < config.max_samples:
        points.append(n)
        n *= 2
    return (*points, config.max_samples)


class GateState(StrEnum):
    SHADOWING = "shadowing"
    PASSED = "passed"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"
    PROMOTING = "promoting"
    DONE = "done"


@dataclass(frozen=True)
class Decision:
    at: float
    before: GateState
    after: GateState
    reason: str
    verdict: GateVerdict | None
    evidence: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "from": str(self.before),
            "to": str(self.after),
            "reason": self.reason,
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "evidence": self.evidence,
        }


class Gate:
    def __init__(
        self,
        config: GateConfig,
        *,
        incumbent: Side,
        candidate: Side,
        pairs: PairLog,
        started_at: float,
        promote: Callable[[str], object] | None = None,
        record: Callable[[Decision], None] | None = None,
        mirror_counts: Callable[[], Mapping[str, int]] = dict,
        teacher_forcing_off: Callable[[], str | None] = lambda: None,
        looks: int | None = None,
    ) -> None:
        """`looks`: how many times the gate will judge (None: the checkpoints, plus the deadline's)."""
        self.config, self.incumbent, self.candidate, self.pairs = config, incumbent, candidate, pairs
        self.started_at = started_at
        self.promote, self.record = promote, record
        self.mirror_counts, self.teacher_forcing_off = mirror_counts, teacher_forcing_off
        self.state = GateState.SHADOWING
        self.decisions: list[Decision] = []
        self.verdict: GateVerdict | None = None  # the latest
        self._checkpoints = checkpoints(config)
        self._next = 0  # index of the next checkpoint
        self._errors_seen = -1  # pairs total at the last error check
        planned = looks if looks is not None else len(self._checkpoints) + (config.deadline_s is not None)
        self.looks = max(1, planned)
        self.look_config = replace(config, confidence=1 - (1 - config.confidence) / self.looks)
        self._lock = threading.Lock()  # the controller's thread evaluates; the admin API reads

    @property
    def shadowing(self) -> bool:
        """Whether the mirror should keep sending copies (its `enabled`)."""
        return self.state is GateState.SHADOWING

    def evidence(self) -> Evidence:
        return Evidence(
            self.incumbent,
            self.candidate,
            self.pairs.snapshot(),
            self.teacher_forcing_off(),
            dict(self.mirror_counts()),
        )

    def evaluate(self, now: float, *, final: bool = False) -> Decision | None:
        """Judge if a checkpoint, the deadline or the end has come; returns the Decision when the state changed."""
        with self._lock:
            if self.state is not GateState.SHADOWING:
                return None
            total = self.pairs.total
            out_of_time = self.config.deadline_s is not None and now - self.started_at >= self.config.deadline_s
            at_checkpoint = self._next < len(self._checkpoints) and total >= self._checkpoints[self._next]
            if not (final or out_of_time or at_checkpoint):
                return self._check_errors(now, total)
            while self._next < len(self._checkpoints) and total >= self._checkpoints[self._next]:
                self._next += 1
            evidence, verdict, error = self._judge()
            if verdict is None:  # fail closed: the incumbent stays
                return self._move(now, GateState.FAILED, f"the gate could not judge: {error!r}", None, evidence)
            self.verdict = verdict
            if verdict.verdict is Verdict.FAIL:
                return self._move(now, GateState.FAILED, verdict.reasons[-1], verdict, evidence)
            if verdict.verdict is Verdict.PASS:
                decision = self._move(now, GateState.PASSED, verdict.reasons[-1], verdict, evidence)
                if self.config.auto_promote and self.promote is not None:
                    return self._promote(now, evidence)
                return decision
            if final or out_of_time or total >= self.config.max_samples:
                why = "final look" if final else ("deadline" if out_of_time else f"{total} pairs")
                return self._move(now, GateState.INCONCLUSIVE, f"{why}: {verdict.reasons[-1]}", verdict, evidence)
            return None

    def _check_errors(self, now: float, total: int) -> Decision | None:
        """Between checkpoints: only whether the candidate's errors already fail it."""
        if total == self._errors_seen:
            return None
        self._errors_seen = total
        try:
            failing = judge_errors(self.pairs.snapshot(), self.config).verdict is Verdict.FAIL
        except Exception as exc:  # fail closed
            logger.exception("the gate could not judge %s", self.candidate.name)
            return self._move(now, GateState.FAILED, f"the gate could not judge: {exc!r}", None, None)
        if not failing:
            return None
        evidence, verdict, error = self._judge()  # the full picture, for the record
        if verdict is None:
            return self._move(now, GateState.FAILED, f"the gate could not judge: {error!r}", None, evidence)
        self.verdict = verdict
        return self._move(now, GateState.FAILED, verdict.reasons[-1], verdict, evidence)

    def _judge(self) -> tuple[Evidence | None, GateVerdict | None, Exception | None]:
        evidence = None
        try:
            evidence = self.evidence()
            return evidence, judge(evidence, self.look_config), None
        except Exception as exc:
            logger.exception("the gate could not judge %s", self.candidate.name)
            return evidence, None, exc

    def abandon(self, now: float, reason: str) -> Decision | None:
        """Stop shadowing for a cause outside the evidence (the candidate never starts): FAILED, fail closed."""
        with self._lock:
            if self.state is not GateState.SHADOWING:
                return None
            evidence, _, _ = self._judge()  # the picture so far, for the record
            return self._move(now, GateState.FAILED, reason, self.verdict, evidence)

    def promote_now(self, now: float) -> Decision:
        """An operator's go after a PASS without auto-promotion."""
        with self._lock:
            if self.state is not GateState.PASSED:
                raise ValueError(f"the gate can promote only after a PASS (it is {self.state})")
            if self.promote is None:
                raise ValueError("this gate was given no way to promote")
            return self._promote(now, self.evidence())

    def _promote(self, now: float, evidence: Evidence) -> Decision:
        assert self.promote is not None
        self._move(now, GateState.PROMOTING, f"switching to {self.candidate.name}", self.verdict, evidence)
        try:
            self.promote(self.candidate.name)
        except Exception as exc:
            logger.exception("promoting %s failed", self.candidate.name)
            return self._move(now, GateState.FAILED, f"promotion failed: {exc!r}", self.verdict, evidence)
        return self._move(now, GateState.DONE, f"{self.candidate.name} serves", self.verdict, evidence)

    def _move(
        self, now: float, to: GateState, reason: str, verdict: GateVerdict | None, evidence: Evidence | None
    ) -> Decision:
        summary = evidence.summary() if evidence is not None else {}
        summary.update(looks=self.looks, confidence_per_look=self.look_config.confidence)
        decision = Decision(now, self.state, to, reason, verdict, summary)
        self.state = to
        self.decisions.append(decision)
        logger.info("gate %s: %s -> %s (%s)", self.candidate.name, decision.before, to, reason)
        if self.record is not None:
            try:
                self.record(decision)
            except Exception:  # a full disk must not stop the gate; the decision is still kept in memory
                logger.exception("recording a gate decision failed")
        return decision

    def snapshot(self) -> dict[str, Any]:
        """What GET /admin/gate shows: state, samples, the latest verdict with its numbers, the decisions."""
        with self._lock:
            return {
                "state": str(self.state),
                "incumbent": self.incumbent.name,
                "candidate": self.candidate.name,
                "samples": len(self.pairs),
                "pairs_total": self.pairs.total,
                "next_checkpoint": self._checkpoints[self._next] if self._next < len(self._checkpoints) else None,
                "confidence_per_look": self.look_config.confidence,
                "teacher_forcing_off": self.teacher_forcing_off(),
                "mirror": dict(self.mirror_counts()),
                "verdict": None if self.verdict is None else self.verdict.to_dict(),
                "decisions": [d.to_dict() for d in self.decisions],
            }
