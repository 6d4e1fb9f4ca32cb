"""Paired bootstrap confidence bounds, the one statistical tool of the gate's verdicts.

Why a bootstrap and not the Wilcoxon signed-rank test: the gate judges the median *and* the p95
of latency, and a rank test says nothing about a tail quantile; the same paired bootstrap also
gives the accuracy ratios their bounds. Resampling whole pairs keeps what the two answers to one
request share (its prompt length, the load at that moment), so request-to-request spread, which
is large, cancels out of the comparison. Percentile bounds from scipy.stats.bootstrap's
resampled distribution, seeded: the same evidence always gives the same verdict.

Two one-sided bounds, each at its own confidence: a verdict PASSES on one bound and FAILS on the
other. A metric PASSES only when all its statistics pass (an intersection-union test: no
correction needed), but FAILS when any one fails, so `fail_confidence` is Bonferroni-corrected
for the number of statistics (`fail_confidence(c, k)`); that keeps the false-FAIL rate of a
metric near 1 - c however many statistics it reads.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["Bound", "fail_confidence", "paired_bounds"]


@dataclass(frozen=True)
class Bound:
    """A point estimate with a lower and an upper one-sided bound."""

    estimate: float
    low: float
    high: float

    @property
    def finite(self) -> bool:
        return all(math.isfinite(x) for x in (self.estimate, self.low, self.high))


def fail_confidence(confidence: float, statistics: int) -> float:
    """The confidence each of `statistics` FAIL tests needs for the metric's FAIL to hold at `confidence`."""
    return 1 - (1 - confidence) / statistics


def paired_bounds(
    statistic: Callable[..., np.ndarray],
    samples: tuple[np.ndarray, ...],
    *,
    low_confidence: float,
    high_confidence: float,
    resamples: int,
    seed: int,
) -> Bound:
    """`statistic(*samples, axis=-1)` with a lower bound at `low_confidence` and an upper one at
    `high_confidence`, from resampling the pairs (rows) together."""
    estimate = float(statistic(*samples, axis=-1))
    if len(samples[0]) < 2:
        return Bound(estimate, -math.inf, math.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)  # all-equal data: a zero-width interval
        result = stats.bootstrap(
            samples,
            statistic,
            paired=True,
            vectorized=True,
            n_resamples=resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    resampled = result.bootstrap_distribution
    resampled = resampled[np.isfinite(resampled)]
    if len(resampled) < resamples // 2:  # mostly undefined (a ratio over nothing): no bounds
        return Bound(estimate, -math.inf, math.inf)
    low, high = np.quantile(resampled, [1 - low_confidence, high_confidence])
    return Bound(estimate, float(low), float(high))
