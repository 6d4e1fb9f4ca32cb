"""What one replica can serve within the latency SLO, from its Profile and the traffic's mix. Pure.

The capacity policy and the simulator's sizing share this measure, so a faster optimizer (a
larger measured decode rate) shows up as a larger capacity, and fewer replicas, without the
scheduler changing a line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tandem.contracts import Profile
from tandem.schedule.policies.context import TokenDemand

__all__ = ["SloCapacity", "live_capacity", "slo_capacity"]


@dataclass(frozen=True)
class SloCapacity:
    batch: int  # concurrent decoding sequences per replica at the SLO
    output_tokens_per_s: float  # one replica's decode throughput at that batch
    meets_slo: bool  # False: even batch 1 is slower than the SLO (the capacity is best effort)
    bound: str = "tpot"  # what stops a larger batch: "tpot", "ttft" (prefill queueing), "kv" or "slots"
    iteration_s: float = 0.0  # mean engine iteration (= each sequence's time per output token) at that batch
    prompt_tokens_per_s: float = 0.0  # the prompt tokens one replica prefills per second at that point

    @property
    def admit(self) -> int:
        """The running sequences a replica should hold at most (admission cap): the decoding batch plus
        the one prompt prefilling beside it. More would only slow every running user's TPOT."""
        return self.batch + 1


def _ttft_ok(
    iteration_s: float, decode_s: float, prompt_tokens_per_s: float, prompt_tokens: float, budget_s: float | None,
    prefill: float, chunk: int,
) -> bool:  # fmt: skip
    """M/M/1 bound on one replica's prefill queue: a prompt waits for those ahead of it, then prefills at
    the speed chunked prefill gets beside the decoding rows; the sojourn must fit the TTFT budget."""
    if budget_s is None or prompt_tokens <= 0 or prefill <= 0:
        return True
    speed = chunk / (decode_s + chunk / prefill)  # prompt tokens/s while a chunk rides every iteration
    busy = prompt_tokens_per_s / speed  # share of the time some prompt is prefilling
    service = prompt_tokens / speed
    return busy < 1 and service / (1 - busy) <= budget_s


def _decode_rates(profile: Profile, most: int) -> list[float]:
    """`profile.decode_capacity(b)` for b in 0..most at once (the same interpolation: linear from 0 up to
    the first measured batch, between measured ones, flat after the last)."""
    points = sorted(profile.decode_tokens_per_s.items())
    if not points:
        return [0.0] * (most + 1)
    sizes, speeds = [b for b, _ in points], [t for _, t in points]
    if sizes[0] > 0:
        sizes, speeds = [0, *sizes], [0.0, *speeds]
    return [float(r) for r in np.interp(np.arange(most + 1), sizes, speeds)]


def slo_capacity(
    profile: Profile,
    tpot_slo_s: float,
    prompt_per_output: float = 0.0,
    tokens_per_sequence: float = 0.0,
    *,
    prompt_tokens: float = 0.0,
    ttft_budget_s: float | None = None,
    chunk_tokens: int = 512,
) -> SloCapacity:
    """The batch with the most throughput whose sequences still meet the SLO, per phase, on the live mix.

    Prompts are prefilled in the same iterations as the decoding rows (continuous batching), so
    each decoding sequence also waits for its share of prefill: in steady state, with
    `prompt_per_output` prompt tokens arriving per output token, a batch of n spends
    n x prompt_per_output / prefill_rate seconds prefilling per iteration besides its n / decode(n).
    A paged KV budget (`Profile.kv_cache_tokens`) holds only so many sequences of
    `tokens_per_sequence` (prompt + output) tokens: the batch never exceeds that. Without a mix
    (0, 0) only decode and the slots count, as the Profile measured them.

    The prefill phase has its own bound (with `ttft_budget_s`, the time a request may take to its first
    token on a replica, and `prompt_tokens`, the mean prompt): the prompt tokens/s the batch brings in
    (`prompt_per_output` x its output rate) must queue and prefill within the budget, at the speed
    chunked prefill (`chunk_tokens` per iteration) gets beside the decoding rows (`_ttft_ok`). A mix of
    long prompts and short answers is TTFT-bound; long prompts with long answers, TPOT-bound.
    """
    prefill = profile.prefill_tokens_per_s
    share = prompt_per_output / prefill if prefill > 0 else 0.0
    most, limit = max(profile.max_slots, 1), "slots"
    if profile.kv_cache_tokens and tokens_per_sequence > 0:
        fits = max(1, int(profile.kv_cache_tokens / tokens_per_sequence))
        if fits < most:
            most, limit = fits, "kv"

    rates = _decode_rates(profile, most)  # rates[b]: decode tokens/s at batch b (rates[0] unused)

    def point(batch: int) -> tuple[str | None, float, float]:
        """(what it breaks or None, seconds per output token, prompt tokens/s) at `batch`."""
        rate = rates[batch] if batch <= most else profile.decode_capacity(batch)
        decode_s = batch / rate if rate > 0 else math.inf
        per_token = decode_s + batch * share
        if per_token > tpot_slo_s * (1 + 1e-9):
            return "tpot", per_token, 0.0
        prompt_rate = prompt_per_output * batch / per_token
        if not _ttft_ok(per_token, decode_s, prompt_rate, prompt_tokens, ttft_budget_s, prefill, chunk_tokens):
            return "ttft", per_token, prompt_rate
        return None, per_token, prompt_rate

    best: tuple[int, float, float, float] | None = None  # (batch, rate, per_token, prompt_rate): asked every tick
    for batch in range(1, most + 1):
        broken, per_token, prompt_rate = point(batch)
        rate = rates[batch]
        if broken is None and (best is None or rate >= best[1]):
            best = (batch, rate, per_token, prompt_rate)
    if best is None:
        rate = profile.decode_capacity(1)
        return SloCapacity(1, rate, False, point(1)[0] or "tpot", point(1)[1], 0.0)
    batch, rate, per_token, prompt_rate = best
    bound = (point(batch + 1)[0] or "tpot") if batch < most else limit  # the next batch breaks it, or pays less
    return SloCapacity(batch, rate, True, bound, per_token, prompt_rate)


def live_capacity(
    profile: Profile,
    tpot_slo_s: float,
    demand: TokenDemand,
    ttft_budget_s: float | None = None,
    chunk_tokens: int = 512,
) -> SloCapacity | None:
    """`slo_capacity` for the length mix the gateway sees now (the finished requests of its demand window),
    per phase (`ttft_budget_s`: what a prompt may wait on a replica). None while nothing finished."""
    if demand.requests_per_s <= 0 or demand.output_tokens_per_s <= 0:
        return None
    prompt = demand.prompt_tokens_per_s / demand.requests_per_s
    per_request = prompt + demand.output_tokens_per_s / demand.requests_per_s
    mix = demand.prompt_tokens_per_s / demand.output_tokens_per_s
    return slo_capacity(profile, tpot_slo_s, mix, per_request, prompt_tokens=prompt, ttft_budget_s=ttft_budget_s,
                        chunk_tokens=chunk_tokens)  # fmt: skip
