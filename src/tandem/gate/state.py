"""The gate's life: SHADOWING -> PASSED / FAILED / INCONCLUSIVE -> PROMOTING -> DONE.

- SHADOWING: the mirror sends the candidate copies of live requests; `evaluate(now)` judges the
  pairs so far (a no-op when none came since the last call, so it can run on every controller tick).
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
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tandem.gate.config import GateConfig
from tandem.gate.judge import Evidence, judge
from tandem.gate.pairs import PairLog
from tandem.gate.sides import Side
from tandem.gate.verdict import GateVerdict, Verdict

__all__ = ["Decision", "Gate", "GateState"]

logger = logging.getLogger("tandem.gate")


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
    ) -> None:
        self.config, self.incumbent, self.candidate, self.pairs = config, incumbent, candidate, pairs
        self.started_at = started_at
        self.promote, self.record = promote, record
        self.mirror_counts, self.teacher_forcing_off = mirror_counts, teacher_forcing_off
        self.state = GateState.SHADOWING
        self.decisions: list[Decision] = []
        self.verdict: GateVerdict | None = None  # the latest
        self._judged_total = -1
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
        """Judge the pairs so far; returns the Decision when the state changed."""
        with self._lock:
            if self.state is not GateState.SHADOWING:
                return None
            out_of_time = self.config.deadline_s is not None and now - self.started_at >= self.config.deadline_s
            if self.pairs.total == self._judged_total and not (final or out_of_time):
                return None
            self._judged_total = self.pairs.total
            evidence = self.evidence()
            try:
                verdict = judge(evidence, self.config)
            except Exception as exc:  # fail closed: the incumbent stays
                logger.exception("the gate could not judge %s", self.candidate.name)
                return self._move(now, GateState.FAILED, f"the gate could not judge: {exc!r}", None, evidence)
            self.verdict = verdict
            if verdict.verdict is Verdict.FAIL:
                return self._move(now, GateState.FAILED, verdict.reasons[-1], verdict, evidence)
            if verdict.verdict is Verdict.PASS:
                decision = self._move(now, GateState.PASSED, verdict.reasons[-1], verdict, evidence)
                if self.config.auto_promote and self.promote is not None:
                    return self._promote(now, evidence)
                return decision
            if final or out_of_time or self.pairs.total >= self.config.max_samples:
                why = "final" if final else ("deadline" if out_of_time else f"{self.pairs.total} pairs")
                return self._move(now, GateState.INCONCLUSIVE, f"{why}: {verdict.reasons[-1]}", verdict, evidence)
            return None

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
        self, now: float, to: GateState, reason: str, verdict: GateVerdict | None, evidence: Evidence
    ) -> Decision:
        decision = Decision(now, self.state, to, reason, verdict, evidence.summary())
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
                "teacher_forcing_off": self.teacher_forcing_off(),
                "mirror": dict(self.mirror_counts()),
                "verdict": None if self.verdict is None else self.verdict.to_dict(),
                "decisions": [d.to_dict() for d in self.decisions],
            }
