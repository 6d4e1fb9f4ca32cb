"""Verdicts: PASS, FAIL or INCONCLUSIVE, per metric and overall, each with its reasons and numbers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["Verdict", "MetricVerdict", "GateVerdict", "worst"]


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"


_RANK = {Verdict.PASS: 0, Verdict.INCONCLUSIVE: 1, Verdict.FAIL: 2}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """FAIL if any failed, else INCONCLUSIVE if any was, else PASS (an empty set is INCONCLUSIVE)."""
    verdicts = list(verdicts)
    return max(verdicts, key=_RANK.__getitem__) if verdicts else Verdict.INCONCLUSIVE


@dataclass(frozen=True)
class MetricVerdict:
    name: str  # latency, accuracy, cost, errors
    verdict: Verdict
    reasons: tuple[str, ...]
    samples: int
    stats: dict[str, Any] = field(default_factory=dict)  # the numbers behind it (JSON-able)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict),
            "reasons": list(self.reasons),
            "samples": self.samples,
            "stats": self.stats,
        }


@dataclass(frozen=True)
class GateVerdict:
    verdict: Verdict
    reasons: tuple[str, ...]
    metrics: dict[str, MetricVerdict]
    pairs: int  # pairs judged

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict),
            "reasons": list(self.reasons),
            "pairs": self.pairs,
            "metrics": {name: m.to_dict() for name, m in self.metrics.items()},
        }
