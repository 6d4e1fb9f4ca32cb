"""What one replica can serve within the latency SLO, from its Profile and the traffic's mix. Pure.

The capacity policy and the simulator's sizing share this measure, so a faster optimizer (a
larger measured decode rate) shows up as a larger capacity, and fewer replicas, without the
scheduler changing a line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tandem.contracts import Profile

__all__ = ["SloCapacity", "slo_capacity"]


@dataclass(frozen=True)
class SloCapacity:
    batch: int  # concurrent sequences per replica at the SLO
    output_tokens_per_s: float  # one replica's decode throughput at that batch
    meets_slo: bool  # False: even batch 1 is slower than the SLO (the capacity is best effort)


def slo_capacity(
    profile: Profile, tpot_slo_s: float, prompt_per_output: float = 0.0, tokens_per_sequence: float = 0.0
) -> SloCapacity:
    """The batch with the most decode throughput whose sequences still meet the TPOT SLO.

    Prompts are prefilled in the same iterations as the decoding rows (continuous batching), so
    each decoding sequence also waits for its share of prefill: in steady state, with
    `prompt_per_output` prompt tokens arriving per output token, a batch of n spends
    n x prompt_per_output / prefill_rate seconds prefilling per iteration besides its n / decode(n).
    A paged KV budget (`Profile.kv_cache_tokens`) holds only so many sequences of
    `tokens_per_sequence` (prompt + output) tokens: the batch never exceeds that. Without a mix
    (0, 0) only decode and the slots count, as the Profile measured them.
    """
    prefill = profile.prefill_tokens_per_s
    share = prompt_per_output / prefill if prefill > 0 else 0.0
    most = max(profile.max_slots, 1)
    if profile.kv_cache_tokens and tokens_per_sequence > 0:
        most = max(1, min(most, int(profile.kv_cache_tokens / tokens_per_sequence)))
    best: SloCapacity | None = None
    for batch in range(1, most + 1):
        rate = profile.decode_capacity(batch)
        per_token = batch / rate + batch * share if rate > 0 else math.inf
        if per_token <= tpot_slo_s * (1 + 1e-9) and (best is None or rate >= best.output_tokens_per_s):
            best = SloCapacity(batch, rate, True)
    return best or SloCapacity(1, profile.decode_capacity(1), False)
