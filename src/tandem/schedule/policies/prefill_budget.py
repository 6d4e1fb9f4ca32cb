"""Admission by prompt tokens: how much prefill a replica may hold before it slows its decoding rows past
the TPOT target. Pure: a frozen budget made from the Profile and the live length mix, asked per request.

A replica iterates: every decoding row makes a token and up to a chunk of prompt tokens is prefilled, so
an iteration takes d(n) + c / prefill_rate (the per-phase model of `policies.slo`). A row is judged on its
mean time per output token over its `o` output tokens; the prefill that rides beside it over that life
must fit the TPOT left over. At the SLO batch (the request cap), the replica's own turnover already
spends most of it: in steady state each row's iteration also carries its share of the prompts that
replace finishing rows, tau(n) = d(n) + n x m / prefill_rate (m prompt tokens per output token). What
is left, (TPOT - tau(n)) per iteration over a row's life, is the prompt tokens a replica may hold waiting
to prefill *on top of* the steady state: a burst meeting free slots then cannot fill them all at once
with long prompts (which would put a full chunk into every iteration for every running row); the rest
wait at the gateway, where a fleet sized too small shows as TTFT, not as every running user's TPOT.

A replica with nothing left to prefill always takes the next prompt, however long (else a prompt longer
than the budget would never be served); the request cap still bounds how many run.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.contracts import Profile
from tandem.schedule.policies.context import TokenDemand
from tandem.schedule.policies.slo import slo_capacity

__all__ = ["PrefillBudget", "prefill_budget"]


@dataclass(frozen=True)
class PrefillBudget:
    tokens: float  # prompt tokens one replica may hold waiting to prefill (beyond 0: see `admits`)

    def admits(self, pending_prefill_tokens: int, prompt_tokens: int) -> bool:
        """May a replica with `pending_prefill_tokens` still to prefill take a prompt of `prompt_tokens`?"""
        return pending_prefill_tokens <= 0 or pending_prefill_tokens + prompt_tokens <= self.tokens


def prefill_budget(
    profile: Profile,
    tpot_slo_s: float,
    demand: TokenDemand,
    ttft_budget_s: float | None = None,
    chunk_tokens: int = 512,
) -> PrefillBudget | None:
    """The budget for the mix the gateway sees now (the finished requests of its demand window), at the
    SLO batch `slo_capacity` chooses for it. None while nothing has finished (no mix: no token cap)."""
    if demand.requests_per_s <= 0 or demand.output_tokens_per_s <= 0 or profile.prefill_tokens_per_s <= 0:
        return None
    prompt = demand.prompt_tokens_per_s / demand.requests_per_s
    output = demand.output_tokens_per_s / demand.requests_per_s
    mix = demand.prompt_tokens_per_s / demand.output_tokens_per_s
    cap = slo_capacity(profile, tpot_slo_s, mix, prompt + output, prompt_tokens=prompt, ttft_budget_s=ttft_budget_s,
                       chunk_tokens=chunk_tokens)  # fmt: skip
    slack_s = max(0.0, tpot_slo_s - cap.iteration_s)  # per iteration, left over by the steady state
    return PrefillBudget(slack_s * profile.prefill_tokens_per_s * max(output - 1.0, 1.0))
