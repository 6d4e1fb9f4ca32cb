"""Synthetic traffic of other shapes than the bundled conversation hour, seeded so every run regenerates
the very same requests: production code completion (short bursts an order of magnitude over the mean,
~2k-token prompts, ~30-token answers), long-context conversation (4-12k-token prompts), a diurnal day
compressed, and lengths drawn from other distributions (heavy-tailed, bimodal).

Lengths are drawn independently per request from the named distribution; arrivals are Poisson at a
rate that follows the shape (`bursty_trace` for bursts, thinning for a time-varying rate).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from tandem.sim.trace import TraceRequest, bursty_trace

__all__ = [
    "LengthSampler",
    "bimodal_lengths",
    "code_completion_trace",
    "diurnal_trace",
    "heavy_tail_lengths",
    "long_context_trace",
    "lognormal_lengths",
    "varying_rate_trace",
]

LengthSampler = Callable[[random.Random], tuple[int, int]]


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return int(min(max(round(median * math.exp(rng.gauss(0.0, sigma))), low), high))


def lognormal_lengths(
    prompt_median: float, output_median: float, prompt_sigma: float = 0.5, output_sigma: float = 0.6,
    prompt_range: tuple[int, int] = (16, 32768), output_range: tuple[int, int] = (1, 4096),
) -> LengthSampler:  # fmt: skip
    """Prompt and output lengths, each log-normal around its median (clipped to its range)."""

    def sample(rng: random.Random) -> tuple[int, int]:
        return (
            _lognormal(rng, prompt_median, prompt_sigma, *prompt_range),
            _lognormal(rng, output_median, output_sigma, *output_range),
        )

    return sample


def heavy_tail_lengths(prompt_min: int = 200, alpha: float = 1.3, output_median: float = 150) -> LengthSampler:
    """Pareto prompts (most short, a few near the context) and log-normal outputs."""

    def sample(rng: random.Random) -> tuple[int, int]:
        prompt = int(min(prompt_min * rng.paretovariate(alpha), 3500))
        return prompt, _lognormal(rng, output_median, 0.7, 1, 500)

    return sample


def bimodal_lengths(share_long: float = 0.3) -> LengthSampler:
    """A mix of short chat turns (~300-token prompts, ~200-token answers) and RAG-style long prompts
    (~3k tokens, ~80-token answers), `share_long` of them long."""
    chat, rag = lognormal_lengths(300, 200, 0.6, 0.6, (16, 2000), (1, 800)), lognormal_lengths(3000, 80, 0.15, 0.5)

    def sample(rng: random.Random) -> tuple[int, int]:
        prompt, output = (rag if rng.random() < share_long else chat)(rng)
        return min(prompt, 3800), output

    return sample


def _lengths(sampler: LengthSampler, count: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed * 7919 + 1)
    return [sampler(rng) for _ in range(count)]


def code_completion_trace(
    duration_s: float = 1800.0,
    mean_rate_per_s: float = 10.0,
    burst_factor: float = 10.0,
    burst_s: float = 10.0,
    bursts_per_hour: float = 24.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Production code completion: Poisson arrivals with `burst_s`-long spells at `burst_factor` x the
    mean, prompts log-normal around 2k tokens (the file around the cursor), answers around 30 tokens."""
    pool = _lengths(lognormal_lengths(2000, 30, 0.35, 0.6, (256, 3800), (1, 256)), 20000, seed)
    return bursty_trace(mean_rate_per_s, duration_s, pool, burst_factor, burst_s, bursts_per_hour, seed=seed)


def varying_rate_trace(
    rate_of: Callable[[float], float], peak_rate: float, duration_s: float, sampler: LengthSampler, seed: int = 0
) -> list[TraceRequest]:
    """Poisson arrivals at rate `rate_of(t)` (at most `peak_rate`), by thinning; lengths from `sampler`."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(peak_rate)
        if t >= duration_s:
            return out
        length = sampler(rng)  # drawn for every candidate, so the lengths do not depend on the thinning
        if rng.random() * peak_rate < rate_of(t):
            out.append(TraceRequest(t, *length))


def long_context_trace(
    duration_s: float = 1800.0, mean_rate_per_s: float = 3.4, seed: int = 0, wobble: float = 0.3
) -> list[TraceRequest]:
    """Long-context conversation: prompts uniform in 4-12k tokens (a long history or a document), answers
    log-normal around 340 tokens; the rate wobbles +-`wobble` over ~10 minutes. Fit it to a shorter
    context with `trace.fit_context`."""

    def lengths(rng: random.Random) -> tuple[int, int]:
        return rng.randint(4000, 12000), _lognormal(rng, 300, 0.5, 16, 1500)

    def rate(t: float) -> float:
        return mean_rate_per_s * (1 + wobble * math.sin(2 * math.pi * t / 600.0))

    return varying_rate_trace(rate, mean_rate_per_s * (1 + wobble), duration_s, lengths, seed)


def diurnal_trace(
    duration_s: float = 3600.0,
    mean_rate_per_s: float = 5.0,
    swing: float = 0.8,
    sampler: LengthSampler | None = None,
    seed: int = 0,
) -> list[TraceRequest]:
    """A day compressed into `duration_s`: the rate swings +-`swing` around its mean, lowest at the
    start (night), highest halfway (afternoon). Default lengths: conversation-like."""
    sampler = sampler or lognormal_lengths(1000, 130, 0.7, 0.8, (16, 3500), (1, 700))

    def rate(t: float) -> float:
        return mean_rate_per_s * (1 - swing * math.cos(2 * math.pi * t / duration_s))

    return varying_rate_trace(rate, mean_rate_per_s * (1 + swing), duration_s, sampler, seed)
