"""Headroom from the traffic's own burstiness, corrected slowly by the SLO attainment it gets. Pure.

A replica takes a cold start (about a minute) to come up, so a burst of a few seconds cannot be
scaled for when it comes: the fleet either holds the room for it already or queues it. How much room
is the traffic's own business, so it is measured, not set:

- Every tick the policy compares the work that arrived over the last w seconds, for w from the
  demand window (10 s) doubling up to about the time a forecast needs to catch a change (the cold
  start plus the forecast's own lag), with what its forecasts had sized the fleet for over those
  seconds (the forecasts made a cold start before them): a `peak`, the forecast's shortfall in
  replicas (`shortfall_need`). A queue absorbs part of it within the TTFT budget `delay_s`: work of
  `came` replicas for `w` seconds needs `came x w / (w + delay_s)` replicas (network calculus, as
  `forecast.burst_rate`; `burst_need` is the same as a ratio). So the room is held for exactly what the
  forecast misses: the bursts it cannot see coming, a step it is slow to follow, the noise of the
  traffic, and nothing for a ramp it followed.
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

__all__ = ["FeedbackGains", "attainment_window", "burst_need", "feedback", "headroom", "peak_windows", "shortfall_need"]


def burst_need(ratio: float, window_s: float, delay_s: float) -> float:
    """The capacity (x the mean's) a burst of `ratio` x the mean for `window_s` needs when it may queue `delay_s`."""
    if window_s <= 0:
        return max(1.0, ratio)
    return max(1.0, ratio * window_s / (window_s + max(delay_s, 0.0)))


def peak_windows(shortest_s: float, reaction_s: float) -> tuple[float, ...]:
    """The windows a shortfall is measured over: `shortest_s`, doubling, while within `reaction_s`."""
    windows, w = [], max(shortest_s, 1e-9)
    while w <= reaction_s * (1 + 1e-9) or not windows:
        windows.append(w)
        w *= 2
    return tuple(windows)


def shortfall_need(
    samples: tuple[tuple[float, float], ...],
    forecasts: tuple[tuple[float, float], ...],
    now: float,
    horizon_s: float,
    windows: tuple[float, ...],
    delay_s: float,
    sample_window_s: float,
) -> float | None:
    """The most replicas beyond the forecast that the work of the last w seconds needed, over `windows`.

    `samples`: (time, work arriving over the `sample_window_s` before it), in replicas; `forecasts`: (time
    made, work forecast for a `horizon_s` later). Over the last w seconds the fleet was the one the
    forecasts made in (now - w - horizon_s, now - horizon_s] asked for; the work that came then (the mean
    of the samples covering those w seconds), a queue absorbing `delay_s` of it, needed `came x w / (w +
    delay_s)` replicas (`burst_need`): the shortfall is that less what was forecast, never below 0. In
    replicas, not as a ratio: a burst needs the same replicas whatever the forecast's noise was, and the
    noise of a quiet hour is not scaled up to a busy one. A NaN forecast is one not to judge (it had too
    little traffic to go on), and no window it sized counts. None while the forecasts do not reach back
    far enough for even the shortest window.
    """
    if not forecasts or not samples:
        return None
    worst = None
    for w in windows:
        if forecasts[0][0] > now - w - horizon_s + 1e-9:
            break  # the windows only grow: no forecast sized this one
        made = [f for t, f in forecasts if now - w - horizon_s < t <= now - horizon_s + 1e-9]
        came = [v for t, v in samples if t >= now - max(w - sample_window_s, 0.0) - 1e-9]
        if not made or not came:
            continue
        if any(math.isnan(f) for f in made):
            break  # a forecast not to be judged (NaN) sized this window, and so every longer one
        need = max(0.0, sum(came) / len(came) * w / (w + max(delay_s, 0.0)) - sum(made) / len(made))
        worst = need if worst is None else max(worst, need)
    return worst


def headroom(peaks: tuple[tuple[float, float, float], ...], quantile: float, least: float = 1.0) -> float:
    """The work-weighted `quantile` of the peaks' needs ((time, need, weight) each), at least `least`
    (1 for needs that are ratios, 0 for needs in replicas beyond the forecast); `least` with none."""
    if not 0 < quantile <= 1:
        raise ValueError(f"the headroom quantile must be in (0, 1] (got {quantile})")
    points = sorted((need, weight) for _, need, weight in peaks if weight > 0)
    total = sum(weight for _, weight in points)
    if not points or total <= 0:
        return least
    seen = 0.0
    for need, weight in points:
        seen += weight
        if seen >= quantile * total * (1 - 1e-12):
            return max(least, need)
    return max(least, points[-1][0])


@dataclass(frozen=True)
class FeedbackGains:
    target: float = 0.99  # the SLO attainment the fleet is held to
    comfort: float = 0.0  # above target + comfort x (1 - target) the gain comes down (0: anywhere above target)
    raise_time_s: float = 600.0  # under target: the gain grows e-fold in this long
    lower_time_s: float = 900.0  # comfortable: it shrinks e-fold in this long
    gain_min: float = 1.0  # the model is the floor: feedback adds room, never takes the forecast's away
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
