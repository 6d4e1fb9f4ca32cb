"""Forecasts the capacity policy sizes for, as pure functions of (time, value) samples.

- `holt`: Holt's linear smoothing (level + trend) on an irregular clock, with the weights given as
  time constants (a tick of dt weighs 1 - exp(-dt / tau)), so the forecast does not depend on how
  often the controller ticks; projected over a horizon (the replicas' cold start: what is started
  now serves the demand of then). The trend's time constant is longer than the cold start, so the
  projection follows ramps, not the noise of a 10-second window.
- `burst_rate`: the service rate that would have kept the queueing delay of the arrivals seen in
  the samples within a delay budget. For an arrival curve A(w) (the most work arriving in any
  window of length w), a server of rate R delays work by at most max over w of A(w)/R - w
  (network calculus), so R >= A(w) / (w + delay) for every w. Bursts shorter than a cold start
  cannot be scaled for when they come; this keeps the capacity that absorbs the recent ones
  within the TTFT SLO, and no more: a burst a queue can absorb within the budget costs nothing.
- `robust_line`: the Theil-Sen line through (time, value) samples: the median of the pairwise slopes
  and the median intercept. A burst that covers under ~29% of the samples moves neither (its breakdown
  point), and the level it gives is the line's value *now*, not the window's middle: a median of the
  last minute lags a ramp by half a minute, this does not.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["burst_rate", "holt", "robust_line"]


def holt(
    level: float | None,
    trend: float,
    updated_at: float | None,
    observed: float,
    now: float,
    level_time_s: float,
    trend_time_s: float,
) -> tuple[float, float]:
    """One update of Holt's linear method: the new (level, trend). Time constants 0: no smoothing."""
    if level is None or updated_at is None or now <= updated_at:
        return (observed if level is None else level), trend
    dt = now - updated_at
    alpha = 1.0 - math.exp(-dt / level_time_s) if level_time_s > 0 else 1.0
    beta = 1.0 - math.exp(-dt / trend_time_s) if trend_time_s > 0 else 1.0
    new_level = alpha * observed + (1 - alpha) * (level + trend * dt)
    return new_level, beta * (new_level - level) / dt + (1 - beta) * trend


def burst_rate(
    samples: tuple[tuple[float, float], ...], delay_s: float, shortest_s: float, longest_s: float = math.inf
) -> float:
    """max over windows w (shortest_s, twice that, ... up to longest_s or the samples' span) of A(w) / (w + delay_s).

    `samples` are (time, rate), oldest first; each rate holds from the previous sample's time to its own.
    """
    if len(samples) < 2:
        return samples[0][1] if samples else 0.0
    points = np.asarray(samples, dtype=float)
    times, rates = points[:, 0], points[:, 1]
    work = np.concatenate(([0.0], np.cumsum(rates[1:] * np.diff(times))))  # work arrived up to each sample
    span, best, window = min(times[-1] - times[0], longest_s), 0.0, max(shortest_s, 1e-9)
    while True:
        # For every end, the latest sample at least `window` before it: the shortest window of that length.
        start = np.searchsorted(times, times - window * (1 - 1e-9), side="right") - 1
        valid = start >= 0
        if valid.any():
            ends, starts = np.nonzero(valid)[0], start[valid]
            best = max(best, float(np.max((work[ends] - work[starts]) / (times[ends] - times[starts] + delay_s))))
        if window >= span:
            return best
        window = min(window * 2, span)


@functools.lru_cache(maxsize=8)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, k=1)


def robust_line(samples: tuple[tuple[float, float], ...], now: float) -> tuple[float, float]:
    """(the Theil-Sen line's value at `now`, its slope per second) through `samples` (time, value).

    One sample (or all at one time): (its median, 0). None: (0, 0).
    """
    if not samples:
        return 0.0, 0.0
    points = np.asarray(samples, dtype=float)
    times, values = points[:, 0], points[:, 1]
    i, j = _pairs(len(times))
    apart = times[j] - times[i]
    keep = apart > 0
    if not keep.any():
        return float(np.median(values)), 0.0
    slope = float(np.median((values[j][keep] - values[i][keep]) / apart[keep]))
    intercept = float(np.median(values - slope * (times - now)))
    return intercept, slope
