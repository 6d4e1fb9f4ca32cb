"""The error verdict: the candidate failing requests the incumbent served fails the gate.

Pairs where the incumbent failed too (a client's bad request, an incumbent outage) say nothing
about the candidate and are left out. Below `min_error_samples` pairs the verdict is INCONCLUSIVE,
unless the candidate has already failed more than the error budget of that many pairs allows
(it cannot come back under the threshold by then): FAIL at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tandem.gate.config import GateConfig
from tandem.gate.pairs import Pair
from tandem.gate.verdict import MetricVerdict, Verdict

__all__ = ["judge_errors"]


def judge_errors(pairs: Sequence[Pair], config: GateConfig) -> MetricVerdict:
    served = [p for p in pairs if p.incumbent.ok]
    failed = [p for p in served if not p.candidate.ok]
    kinds = Counter((p.candidate.error or "").split(":")[0] for p in failed)
    n, errors = len(served), len(failed)
    rate = errors / n if n else 0.0
    stats = {"pairs": n, "candidate_errors": errors, "rate": rate, "threshold": config.max_error_rate,
             "kinds": dict(kinds.most_common(5)), "both_failed": sum(not p.incumbent.ok for p in pairs)}  # fmt: skip
    text = f"candidate errors {errors}/{n} ({rate:.1%}) against a budget of {config.max_error_rate:.1%}"
    if failed:
        text += f"; first: {failed[0].candidate.error}"
    if n < config.min_error_samples:
        if errors > config.max_error_rate * config.min_error_samples:
            return MetricVerdict("errors", Verdict.FAIL, (f"{text}: over budget already",), n, stats)
        return MetricVerdict(
            "errors",
            Verdict.INCONCLUSIVE,
            (f"{text}: fewer than the {config.min_error_samples} pairs required",),
            n,
            stats,
        )
    if rate > config.max_error_rate:
        return MetricVerdict("errors", Verdict.FAIL, (f"{text}: over budget",), n, stats)
    return MetricVerdict("errors", Verdict.PASS, (f"{text}: within budget",), n, stats)
