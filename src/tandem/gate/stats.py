"""Paired bootstrap confidence bounds, the one statistical tool of the gate's verdicts.

Why a bootstrap and not the Wilcoxon signed-rank test: the gate judges the median *and* the p95
of latency, and a rank test says nothing about a tail quantile; the same paired bootstrap also
gives the accuracy ratios their bounds. Resampling whole pairs keeps what the two answers to one
request share (its prompt length, the load at that moment), so request-to-request spread, which
is large, cancels out of the comparison. Percentile intervals (scipy.stats.bootstrap), seeded:
the same evidence always gives the same verdict.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["Bound", "paired_bounds"]


@dataclass(frozen=True)
class Bound:
    """A point estimate with one-sided lower and upper bounds, each at the given confidence."""

    estimate: float
    low: float
    high: float

    @property
    def finite(self) -> bool:
        return all(math.isfinite(x) for x in (self.estimate, self.low, self.high))


def paired_bounds(
    statistic: Callable[..., np.ndarray],
    samples: tuple[np.ndarray, ...],
    *,
    confidence: float,
    resamples: int,
    seed: int,
) -> Bound:
    """`statistic(*samples, axis=-1)` with bounds from resampling the pairs (rows) together.

    The two-sided interval at 2*confidence - 1 has ends that are one-sided bounds at `confidence`.
    """
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
            confidence_level=2 * confidence - 1,
            n_resamples=resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    return Bound(estimate, float(result.confidence_interval.low), float(result.confidence_interval.high))
