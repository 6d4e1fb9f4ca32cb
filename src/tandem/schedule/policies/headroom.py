"""Headroom from the traffic's own burstiness, corrected slowly by the SLO attainment it gets. Pure.

A replica takes a cold start (about a minute) to come up, so a burst of a few seconds cannot be
scaled for when it comes: the fleet either holds the room for it already or queues it. How much room
is the traffic's own business, so it is measured, not set:

- Every tick the policy compares the work arriving in the last few seconds (a 10 s window) with the
  last minute's mean: a `peak`. A queue absorbs part of a burst within the TTFT budget `delay_s`:
  a burst of `ratio` x the mean lasting `window_s` needs `ratio x window_s / (window_s + delay_s)`
  x the mean's capacity (network calculus, as `forecast.burst_rate`), and never less than 1.
- `headroom` is a quantile of that need over a sliding horizon, each peak weighted by the work it
  carried: to keep `quantile` of the *requests* within the SLO, the fleet must absorb the bursts
  that carry more than 1 - quantile of the work, however rare they are in time.
- `feedback` multiplies it by a gain that the observed attainment (`attainment_window`: the share of
  the requests of the last two minutes that met the SLO) moves slowly: below target the
  gain grows by `exp(dt / raise_time_s)` per tick, comfortably above it (`target + comfort x
  (1 - target)`) it shrinks by `exp(-dt / lower_time_s)`, within [gain_min, gain_max] ([0.8, 1.3]): e-fold in
  10 minutes up, 15 minutes down, so the gain corrects a persistent bias, never a single burst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["FeedbackGains", "attainment_window", "burst_need", "feedback", "headroom"]


def burst_need(ratio: float, window_s: float, delay_s: float) -> float:
    """The capacity (x the mean's) a burst of `ratio` x the mean for `window_s` needs when it may queue `delay_s`."""
    if window_s <= 0:
        return max(1.0, ratio)
    return max(1.0, ratio * window_s / (window_s + max(delay_s, 0.0)))


def headroom(peaks: tuple[tuple[float, float, float], ...], quantile: float) -> float:
    """The work-weighted `quantile` of the peaks' needs ((time, need, weight) each); 1 with none."""
    if not 0 < quantile <= 1:
        raise ValueError(f"the headroom quantile must be in (0, 1] (got {quantile})")
    points = sorted((need, weight) for _, need, weight in peaks if weight > 0)
    total = sum(weight for _, weight in points)
    if not points or total <= 0:
        return 1.0
    seen = 0.0
    for need, weight in points:
        seen += weight
        if seen >= quantile * total * (1 - 1e-12):
            return max(1.0, need)
    return max(1.0, points[-1][0])


@dataclass(frozen=True)
class FeedbackGains:
    target: float = 0.99  # the SLO attainment the fleet is held to
    comfort: float = 0.0  # above target + comfort x (1 - target) the gain comes down (0: anywhere above target)
    raise_time_s: float = 600.0  # under target: the gain grows e-fold in this long
    lower_time_s: float = 900.0  # comfortable: it shrinks e-fold in this long
    gain_min: float = 0.8
    gain_max: float = 1.3
    window_s: float = 120.0  # the attainment the gain follows: requests within the SLO, decayed over this long

    def __post_init__(self) -> None:
        if not 0 < self.target < 1 or not 0 <= self.comfort <= 1:
            raise ValueError("feedback needs a target in (0, 1) and comfort in [0, 1]")
        if min(self.raise_time_s, self.lower_time_s, self.window_s) <= 0 or not 0 < self.gain_min <= 1 <= self.gain_max:
            raise ValueError("feedback needs positive time constants and gain_min <= 1 <= gain_max")


def feedback(gain: float, attainment: float | None, dt: float, gains: FeedbackGains = FeedbackGains()) -> float:
    """The headroom gain after one tick of `dt` seconds that saw `attainment` (None: nothing finished)."""
    if attainment is None or dt <= 0:
        return gain
    if attainment < gains.target:
        gain *= math.exp(dt / gains.raise_time_s)
    elif attainment > gains.target + gains.comfort * (1 - gains.target):
        gain *= math.exp(-dt / gains.lower_time_s)
    return min(max(gain, gains.gain_min), gains.gain_max)


def attainment_window(
    attained: tuple[float, float], share: float | None, requests_per_s: float, dt: float, gains: FeedbackGains
) -> tuple[float, float]:
    """(requests within the SLO, requests) over the last `gains.window_s`, exponentially decayed: one tick
    of `dt` that finished `requests_per_s` requests, `share` of them within the SLO (None: none known)."""
    if dt <= 0:
        return attained
    keep = math.exp(-dt / gains.window_s)
    good, total = attained[0] * keep, attained[1] * keep
    if share is not None and requests_per_s > 0:
        good, total = good + share * requests_per_s * dt, total + requests_per_s * dt
    return good, total
