"""The latency verdict: is the candidate's TTFT and time per output token no worse than the incumbent's?

Each pair gives a per-request log-ratio log(candidate / incumbent) for TTFT and for TPOT (only
streamed pairs have them; TPOT needs two output tokens). For each of the two, two statistics:
- median: the median of the paired log-ratios (how much slower the typical request is);
- p95: log(p95 of the candidate's values / p95 of the incumbent's), on the same requests, each
  p95 the Harrell-Davis estimate (a weighted sum of all order statistics instead of the one or
  two nearest 95%: in seeded trials it passed equal distributions about 1.5x as often at the
  same sample size, with no more false fails).
Each statistic gets one-sided bounds from the paired bootstrap (tandem.gate.stats) and a margin
m = log(1 + tolerance):
- PASS when the upper bound (at `confidence`) is at most m: the candidate is not slower by more
  than the tolerance (a non-inferiority test);
- FAIL when the lower bound (at `confidence`, Bonferroni-corrected for the four statistics) is
  above 0 and the estimate above m: it is slower, and by more than the tolerance by the best
  estimate;
- INCONCLUSIVE otherwise (too few pairs to tell).
Fewer than `min_latency_samples` pairs is INCONCLUSIVE outright. The metric's verdict is the worst
of its four statistics. Power and false-fail rate at the default settings: tests/gate/test_latency.py
and the docs' gate page (docs/gate.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import betainc

from tandem.gate.config import GateConfig
from tandem.gate.pairs import Pair
from tandem.gate.stats import Bound, fail_confidence, paired_bounds
from tandem.gate.verdict import MetricVerdict, Verdict, worst

__all__ = ["harrell_davis", "judge_latency", "judge_statistic", "latency_samples", "median_log_ratio", "p95_log_ratio"]

METRICS = ("ttft", "tpot")


def median_log_ratio(incumbent: np.ndarray, candidate: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(np.log(candidate) - np.log(incumbent), axis=axis)


def harrell_davis(values: np.ndarray, q: float) -> np.ndarray:
    """The Harrell-Davis estimate of quantile q along the last axis (Biometrika 69, 1982)."""
    ordered = np.sort(values, axis=-1)
    n = ordered.shape[-1]
    a, b = q * (n + 1), (1 - q) * (n + 1)
    weights = np.diff(betainc(a, b, np.arange(n + 1) / n))
    return ordered @ weights


def p95_log_ratio(incumbent: np.ndarray, candidate: np.ndarray, axis: int = -1) -> np.ndarray:
    if axis not in (-1, incumbent.ndim - 1):
        raise ValueError("p95_log_ratio reduces the last axis")
    return np.log(harrell_davis(candidate, 0.95)) - np.log(harrell_davis(incumbent, 0.95))


STATISTICS = {"median": median_log_ratio, "p95": p95_log_ratio}


def _usable(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def latency_samples(pairs: Sequence[Pair], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(incumbent, candidate) values of `metric` ("ttft", "tpot", "e2e_s"...) over the pairs that have both."""
    field = metric if metric.endswith("_s") else f"{metric}_s"
    rows = [
        (getattr(p.incumbent, field), getattr(p.candidate, field))
        for p in pairs
        if p.comparable and _usable(getattr(p.incumbent, field)) and _usable(getattr(p.candidate, field))
    ]
    if not rows:
        return np.empty(0), np.empty(0)
    inc, cand = zip(*rows, strict=True)
    return np.asarray(inc, dtype=float), np.asarray(cand, dtype=float)


def judge_statistic(bound: Bound, tolerance: float) -> tuple[Verdict, str]:
    margin = math.log1p(tolerance)
    ratio, low, high = (math.exp(x) for x in (bound.estimate, bound.low, bound.high))
    text = f"{ratio:.3f}x (bounds {low:.3f}-{high:.3f}) against a tolerance of {1 + tolerance:.2f}x"
    if not bound.finite:
        return Verdict.INCONCLUSIVE, f"{text}: no bounds"
    if bound.high <= margin:
        return Verdict.PASS, f"{text}: not slower beyond the tolerance"
    if bound.low > 0 and bound.estimate > margin:
        return Verdict.FAIL, f"{text}: slower, beyond the tolerance"
    return Verdict.INCONCLUSIVE, f"{text}: cannot tell yet"


def judge_latency(pairs: Sequence[Pair], config: GateConfig) -> MetricVerdict:
    verdicts, reasons, stats = [], [], {}
    counts = []
    fail_at = fail_confidence(config.confidence, len(METRICS) * len(STATISTICS))
    for metric in METRICS:
        inc, cand = latency_samples(pairs, metric)
        counts.append(len(inc))
        if len(inc) < config.min_latency_samples:
            verdicts.append(Verdict.INCONCLUSIVE)
            reasons.append(f"{metric}: {len(inc)} pairs, fewer than the {config.min_latency_samples} required")
            stats[metric] = {"samples": len(inc)}
            continue
        stats[metric] = {"samples": len(inc)}
        for offset, (name, statistic) in enumerate(STATISTICS.items()):
            tolerance = config.latency_median_tolerance if name == "median" else config.latency_p95_tolerance
            bound = paired_bounds(
                statistic, (inc, cand),
                low_confidence=fail_at, high_confidence=config.confidence,
                resamples=config.bootstrap_resamples, seed=config.seed + offset,
            )  # fmt: skip
            verdict, why = judge_statistic(bound, tolerance)
            verdicts.append(verdict)
            reasons.append(f"{metric} {name}: {why}")
            stats[metric][name] = {
                "ratio": math.exp(bound.estimate),
                "low": math.exp(bound.low),
                "high": math.exp(bound.high),
                "tolerance": tolerance,
                "verdict": str(verdict),
            }
        stats[metric]["incumbent_p50_s"] = float(np.median(inc))
        stats[metric]["candidate_p50_s"] = float(np.median(cand))
        stats[metric]["incumbent_p95_s"] = float(harrell_davis(inc, 0.95))
        stats[metric]["candidate_p95_s"] = float(harrell_davis(cand, 0.95))
    return MetricVerdict("latency", worst(verdicts), tuple(reasons), min(counts), stats)
