"""Admission by prompt tokens: how much prefill a replica may be sent before it slows its decoding rows past
the TPOT target. Pure: a frozen budget made from the Profile and the live length mix, asked per request.

A replica iterates: every decoding row makes a token and up to a chunk of prompt tokens is prefilled, so
an iteration takes d(n) + c / prefill_rate (the per-phase model of `policies.slo`). Two limits follow.

- **The pace.** Prompt tokens sent at P tokens/s take P / prefill_rate of every second, so n rows decode
  at TPOT d(n) / (1 - P / prefill_rate): to keep the target T a replica with n rows may be sent at most
  `(T - d(n)) x prefill_rate / T` prompt tokens a second, on average (`pace`). This is what a burst
  breaks: every admission that only bounds the prompt tokens *waiting* on a replica refills as they drain,
  so under a queue at the gateway every iteration carried a full chunk (41 ms of decode + 79 ms of
  prefill on the suite's H100 profile: a TPOT of 120 ms for every row that lived through it).
- **The depth.** Above the pace, a replica may take `tokens` at once (a generic cell rate: it is sent a
  prompt while what it was sent, paid off at the pace, is at most `tokens` ahead of now; `routers.paced`). The
  rows' steady state at the SLO batch, tau(n) = d(n) + n x m / prefill_rate (m prompt tokens per output
  token), leaves (T - tau(n)) per iteration; over the life of a *short* row (`TokenDemand.short_output_tokens`,
  a low quantile of the recent outputs: the rows that miss first are the short answers, judged over a few
  tokens) that carries `tokens` = (T - tau(n)) x prefill_rate x (o_short - 1) prompt tokens.

A replica whose pace has caught up (nothing sent ahead of now) always takes the next prompt, however long
(else a prompt longer than the depth would never be served); it then gets nothing more until that prompt
is paid off at the pace. The request cap still bounds how many run.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.contracts import Profile
from tandem.schedule.policies.context import TokenDemand
from tandem.schedule.policies.slo import SloCapacity, _decode_rates, live_capacity

__all__ = ["PrefillBudget", "admission", "prefill_budget"]


@dataclass(frozen=True)
class PrefillBudget:
    tokens: float  # prompt tokens one replica may hold waiting to prefill, or be sent beyond its pace
    pace_by_rows: tuple[float, ...] = ()  # [n]: prompt tokens/s a replica running n rows may be sent (beyond: last)

    def admits(self, pending_prefill_tokens: int, prompt_tokens: int) -> bool:
        """May a replica with `pending_prefill_tokens` still to prefill take a prompt of `prompt_tokens`?"""
        return pending_prefill_tokens <= 0 or pending_prefill_tokens + prompt_tokens <= self.tokens

    def pace(self, rows: int) -> float | None:
        """Prompt tokens/s a replica running `rows` sequences may be sent on average (None: no pace)."""
        if not self.pace_by_rows:
            return None
        return self.pace_by_rows[min(max(rows, 0), len(self.pace_by_rows) - 1)]


def prefill_budget(
    profile: Profile,
    tpot_slo_s: float,
    demand: TokenDemand,
    ttft_budget_s: float | None = None,
    chunk_tokens: int = 512,
) -> PrefillBudget | None:
    """The budget for the mix the gateway sees now (the finished requests of its demand window), at the
    SLO batch `slo_capacity` chooses for it. None while nothing has finished (no mix: no token cap)."""
    return admission(profile, tpot_slo_s, demand, ttft_budget_s, chunk_tokens)[1]


def admission(
    profile: Profile,
    tpot_slo_s: float,
    demand: TokenDemand,
    ttft_budget_s: float | None = None,
    chunk_tokens: int = 512,
) -> tuple[int | None, PrefillBudget | None]:
    """The admission of one mix, its SLO capacity computed once: (the running sequences one replica should
    hold, the SLO batch's `admit`; its `prefill_budget`). (None, None) while nothing has finished; the
    budget None without a prefill rate. The gateway (`gateway.slo_admission`) and the simulator ask this."""
    cap = live_capacity(profile, tpot_slo_s, demand, ttft_budget_s, chunk_tokens)
    if cap is None:
        return None, None
    return cap.admit, (_budget(profile, tpot_slo_s, demand, cap) if profile.prefill_tokens_per_s > 0 else None)


def _budget(profile: Profile, tpot_slo_s: float, demand: TokenDemand, cap: SloCapacity) -> PrefillBudget:
    rate = profile.prefill_tokens_per_s
    slack_s = max(0.0, tpot_slo_s - cap.iteration_s)  # per iteration, left over by the steady state
    output = demand.output_tokens_per_s / demand.requests_per_s
    life = demand.short_output_tokens if demand.short_output_tokens is not None else output
    rates = _decode_rates(profile, max(profile.max_slots, 1))
    pace = tuple(max(0.0, 1.0 - (n / rates[n] if n and rates[n] > 0 else 0.0) / tpot_slo_s) * rate
                 for n in range(len(rates)))  # fmt: skip
    return PrefillBudget(slack_s * rate * max(life - 1.0, 1.0), pace)
