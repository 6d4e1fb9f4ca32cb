"""Per-tenant limits as pure decisions on frozen state, the clock passed in as data.

- RPM and TPM are token buckets holding one minute's worth, refilled continuously (a tenant at
  `rpm: 600` may burst 600 requests, then gets one every 0.1 s). A request takes one request and
  its prompt tokens (estimated at admission) from them; output tokens are taken as they stream
  (`charge`), so a long answer can leave the token bucket below zero: the next request waits.
- `max_concurrency`: requests in flight at once (waiting at the gateway counts).
- Daily budgets (`tokens_per_day`, `dollars_per_day`): reset at 00:00 UTC; past one, every request
  is refused until the next day.

`admit` answers `Verdict(allowed, limit, retry_after_s)` and the new state; `ratelimit_headers`
the `x-ratelimit-*` headers OpenAI sends (limit, remaining, reset for requests and for tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tandem.deployment.tenants import Tenant

__all__ = ["Bucket", "TenantState", "Verdict", "admit", "charge", "finish", "ratelimit_headers", "reset_text"]

DAY_S = 86400.0


@dataclass(frozen=True)
class Bucket:
    level: float
    at: float  # when `level` was true

    def refilled(self, now: float, capacity: float) -> Bucket:
        rate = capacity / 60.0
        return Bucket(min(capacity, self.level + max(0.0, now - self.at) * rate), max(now, self.at))

    def seconds_until(self, need: float, capacity: float) -> float:
        """From `at`, how long until the bucket holds `need` (capped at its capacity)."""
        need = min(need, capacity)
        return max(0.0, (need - self.level) / (capacity / 60.0))


@dataclass(frozen=True)
class TenantState:
    requests: Bucket | None = None  # None until first used: a full bucket
    tokens: Bucket | None = None
    in_flight: int = 0
    day: int = -1  # UTC day number the totals below are for
    tokens_today: int = 0
    dollars_today: float = 0.0


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    limit: str | None = None  # which: rpm, tpm, max_concurrency, tokens_per_day, dollars_per_day
    retry_after_s: float = 0.0
    message: str = ""


def _bucket(bucket: Bucket | None, capacity: float | None, now: float) -> Bucket | None:
    if capacity is None:
        return None
    return Bucket(capacity, now) if bucket is None else bucket.refilled(now, capacity)


def _today(state: TenantState, now: float) -> TenantState:
    day = int(now // DAY_S)
    return state if state.day == day else replace(state, day=day, tokens_today=0, dollars_today=0.0)


def admit(state: TenantState, tenant: Tenant, now: float, prompt_tokens: int) -> tuple[Verdict, TenantState]:
    """Whether `tenant` may start a request of `prompt_tokens` at `now` (wall-clock seconds, UTC);
    the state after it (taken from the buckets, counted in flight) or unchanged when refused."""
    limits, budget = tenant.limits, tenant.budget
    state = _today(state, now)
    requests, tokens = _bucket(state.requests, limits.rpm, now), _bucket(state.tokens, limits.tpm, now)
    state = replace(state, requests=requests, tokens=tokens)
    to_midnight = (state.day + 1) * DAY_S - now
    if budget.tokens_per_day is not None and state.tokens_today >= budget.tokens_per_day:
        return Verdict(
            False, "tokens_per_day", to_midnight,
            f"tenant {tenant.name!r} used its budget of {budget.tokens_per_day} tokens today (UTC); "
            "it resets at 00:00 UTC",
        ), state  # fmt: skip
    if budget.dollars_per_day is not None and state.dollars_today >= budget.dollars_per_day:
        return Verdict(
            False, "dollars_per_day", to_midnight,
            f"tenant {tenant.name!r} used its budget of ${budget.dollars_per_day:g} today (UTC); it resets at "
            "00:00 UTC",
        ), state  # fmt: skip
    if limits.max_concurrency is not None and state.in_flight >= limits.max_concurrency:
        return Verdict(
            False, "max_concurrency", 1.0,
            f"tenant {tenant.name!r} has {state.in_flight} requests in flight, its max_concurrency",
        ), state  # fmt: skip
    if requests is not None and limits.rpm is not None and requests.level < 1.0:
        wait = requests.seconds_until(1.0, limits.rpm)
        return Verdict(
            False, "rpm", wait, f"tenant {tenant.name!r} is over its limit of {limits.rpm:g} requests per minute"
        ), state  # fmt: skip
    if tokens is not None and limits.tpm is not None:
        need = min(float(max(prompt_tokens, 1)), limits.tpm)
        if tokens.level < need:
            return Verdict(
                False, "tpm", tokens.seconds_until(need, limits.tpm),
                f"tenant {tenant.name!r} is over its limit of {limits.tpm:g} tokens per minute",
            ), state  # fmt: skip
    state = replace(
        state,
        requests=replace(requests, level=requests.level - 1.0) if requests is not None else None,
        tokens=replace(tokens, level=tokens.level - prompt_tokens) if tokens is not None else None,
        in_flight=state.in_flight + 1,
        tokens_today=state.tokens_today + prompt_tokens,
    )
    return Verdict(True), state


def charge(state: TenantState, tenant: Tenant, now: float, tokens: int = 0, dollars: float = 0.0) -> TenantState:
    """Tokens (output as it streams, or a correction of the prompt estimate: may be negative) and dollars
    the tenant used at `now`."""
    state = _today(state, now)
    bucket = _bucket(state.tokens, tenant.limits.tpm, now)
    if bucket is not None:
        bucket = replace(bucket, level=min(bucket.level - tokens, tenant.limits.tpm or math.inf))
    return replace(
        state, tokens=bucket, tokens_today=max(0, state.tokens_today + tokens),
        dollars_today=state.dollars_today + dollars,
    )  # fmt: skip


def finish(state: TenantState) -> TenantState:
    """A request of the tenant ended (answered, refused downstream, or the client left)."""
    return replace(state, in_flight=max(0, state.in_flight - 1))


def reset_text(seconds: float) -> str:
    """A duration as OpenAI writes it in x-ratelimit-reset-*: "1s", "6m0s", "20ms"."""
    if seconds < 1.0:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    seconds = math.ceil(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def ratelimit_headers(state: TenantState, tenant: Tenant, now: float) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the tenant's RPM and TPM limits (none for a limit not set)."""
    out: dict[str, str] = {}
    for kind, capacity, bucket in (
        ("requests", tenant.limits.rpm, state.requests),
        ("tokens", tenant.limits.tpm, state.tokens),
    ):
        if capacity is None:
            continue
        current = _bucket(bucket, capacity, now)
        assert current is not None
        out[f"x-ratelimit-limit-{kind}"] = f"{capacity:g}"
        out[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(current.level)))
        out[f"x-ratelimit-reset-{kind}"] = reset_text(current.seconds_until(capacity, capacity))
    return out
