"""Builders shared by the gate's tests: observations, pairs, Profiles (OpenAI-shaped bodies: completion_events)."""

from __future__ import annotations

import numpy as np

from tandem.contracts import Profile
from tandem.gate.agreement import TokenAgreement
from tandem.gate.pairs import Pair, Sampling
from tandem.measure.logprobs import TokenTrack
from tandem.measure.observation import Observation

# Tolerances for real-replica runs that are not about latency: a few dozen pairs timed on a shared
# 2-core CI machine decide nothing about a 5-10% tolerance (tests/gate/test_latency.py pins the
# statistics; the slow-candidate runs keep a real latency FAIL end to end).
LOOSE_LATENCY = {"latency_median": 1.0, "latency_p95": 2.0}

GREEDY = Sampling(temperature=0.0, max_tokens=16, stream=True, logprobs=True)


def obs(ttft=0.1, tpot=0.02, tokens=10, text="out", error=None, status=200, track=None) -> Observation:
    e2e = None if ttft is None else ttft + (tpot or 0) * (tokens - 1)
    return Observation(status, error, e2e, ttft, tpot, tokens, text, "length", track)


def pair(i=0, inc=None, cand=None, sampling=GREEDY, agreement=None) -> Pair:
    return Pair(f"r{i}", "/v1/completions", float(i), sampling, inc or obs(), cand or obs(), agreement)


def agreeing(i: int, positions: int, agree: int, gap_per_token: float = 0.0) -> Pair:
    """A pair with token-level evidence (and identical texts when all positions agree)."""
    text = "same" if agree == positions else f"diff{i}"
    return pair(
        i, obs(text="same"), obs(text=text),
        agreement=TokenAgreement("teacher-forced", positions, agree, positions, gap_per_token * positions),
    )  # fmt: skip


def latency_pairs(n: int, slowdown: float, seed: int, request_sd: float = 0.5, noise_sd: float = 0.15) -> list[Pair]:
    """Paired latencies: a per-request level both variants share (prompt length, the load then:
    lognormal, sd `request_sd`) times each variant's own noise (lognormal, sd `noise_sd`); the
    candidate's TTFT and TPOT are multiplied by `slowdown`."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ttft_level, tpot_level = rng.normal(0, request_sd, 2)
        noise = rng.normal(0, noise_sd, 4)
        inc = obs(ttft=0.2 * np.exp(ttft_level + noise[0]), tpot=0.02 * np.exp(tpot_level + noise[1]))
        cand = obs(
            ttft=slowdown * 0.2 * np.exp(ttft_level + noise[2]), tpot=slowdown * 0.02 * np.exp(tpot_level + noise[3])
        )
        out.append(pair(i, inc, cand))
    return out


def profile(recipe="baseline", rates=None, max_slots=32, hardware="cpu-2c-avx512") -> Profile:
    rates = rates or {1: 50.0, 4: 180.0, 16: 500.0, 32: 700.0}
    return Profile(recipe, hardware, "tiny", 1000, 64, max_slots, rates, 1000.0, 0.05, 3.0)


def track(tokens, logprobs=None, top1=None, offsets=None) -> TokenTrack:
    n = len(tokens)
    return TokenTrack(tuple(tokens), tuple(logprobs or [-0.1] * n), tuple(top1 or tokens), offsets)
