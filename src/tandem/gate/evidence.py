"""judge(evidence, config) -> GateVerdict: the gate's one decision, a pure function.

Four verdicts: latency, accuracy, unit cost (the three the candidate must pass) and errors (a
candidate failing requests fails the gate). Overall: FAIL if any failed, PASS only if all four
passed, INCONCLUSIVE otherwise. Fail closed: evidence the judge cannot read is INCONCLUSIVE or
FAIL, never PASS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.gate.accuracy import judge_accuracy
from tandem.gate.config import GateConfig
from tandem.gate.cost import judge_cost
from tandem.gate.errors import judge_errors
from tandem.gate.latency import judge_latency
from tandem.gate.pairs import Pair
from tandem.gate.sides import Side
from tandem.gate.verdict import GateVerdict, Verdict, worst

__all__ = ["Evidence", "judge"]


@dataclass(frozen=True)
class Evidence:
    incumbent: Side
    candidate: Side
    pairs: tuple[Pair, ...]
    teacher_forcing_off: str | None = None  # why accuracy fell back to shared prefixes, if it did
    mirror: dict[str, int] = field(default_factory=dict)  # the mirror's counts (dropped, cancelled, ...)

    def summary(self) -> dict[str, Any]:
        return {
            "incumbent": self.incumbent.name,
            "candidate": self.candidate.name,
            "pairs": len(self.pairs),
            "teacher_forcing_off": self.teacher_forcing_off,
            "mirror": dict(self.mirror),
        }


def judge(evidence: Evidence, config: GateConfig) -> GateVerdict:
    pairs = evidence.pairs
    metrics = {
        "latency": judge_latency(pairs, config),
        "accuracy": judge_accuracy(pairs, config, evidence.teacher_forcing_off),
        "cost": judge_cost(evidence.incumbent, evidence.candidate, config),
        "errors": judge_errors(pairs, config),
    }
    verdict = worst(m.verdict for m in metrics.values())
    reasons = tuple(f"{name}: {m.verdict}" for name, m in metrics.items())
    if verdict is Verdict.PASS:
        reasons += (f"{evidence.candidate.name} passed latency, accuracy and cost against {evidence.incumbent.name}",)
    elif verdict is Verdict.FAIL:
        failed = ", ".join(name for name, m in metrics.items() if m.verdict is Verdict.FAIL)
        reasons += (f"{evidence.candidate.name} failed {failed}; {evidence.incumbent.name} stays",)
    else:
        pending = ", ".join(name for name, m in metrics.items() if m.verdict is Verdict.INCONCLUSIVE)
        reasons += (f"not enough evidence yet on {pending}; {evidence.incumbent.name} stays",)
    return GateVerdict(verdict, reasons, metrics, len(pairs))
