"""Fallback: what the gateway does when an attempt to serve a request fails. Pure decision logic.

The rule that matters: before the first byte reached the client, a failed request can be re-run
(nothing was promised yet); after it, it can only be resumed from what the client already has
(tandem.gateway.resume), and where it cannot, the stream ends with a clear error event instead.

- A client error (4xx: a bad request) is the client's: passed through, never retried.
- The replica was unreachable or refused (connection error, 503 while draining, 429 queue full):
  a replica problem, not the variant's. Another replica of the same variant if there is one, else
  the fallback variant.
- The variant failed (5xx, timeout, an injected fault): the fallback variant, counted as a
  fallback; without one, another replica of the same variant.
- Out of attempts, or the fallback itself failed with nowhere left to go: a 503 to the client.

`breaker_outcome` says what each failure means to the variant's circuit breaker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from tandem.schedule.breaker import Outcome

__all__ = [
    "Attempt",
    "ErrorEvent",
    "Fail",
    "FailureKind",
    "FallbackPlan",
    "PassThrough",
    "Retry",
    "after_failure",
    "breaker_outcome",
    "classify_status",
]


class FailureKind(StrEnum):
    UNREACHABLE = "unreachable"  # connection refused/reset, or the process died, before any response
    UNAVAILABLE = "unavailable"  # 503 (draining, still loading) or 429 (its queue is full)
    TIMEOUT = "timeout"  # no first byte within the deadline
    SERVER_ERROR = "server_error"  # 5xx: the variant failed
    CLIENT_ERROR = "client_error"  # 4xx other than 429: the request is wrong


def classify_status(status: int) -> FailureKind | None:
    """What an HTTP status from a replica means (None: success)."""
    if status < 400:
        return None
    if status in (429, 503):
        return FailureKind.UNAVAILABLE
    if status >= 500:
        return FailureKind.SERVER_ERROR
    return FailureKind.CLIENT_ERROR


def breaker_outcome(kind: FailureKind) -> Outcome | None:
    """A variant's breaker counts its own failures: not a busy or dead replica, not a bad request."""
    if kind is FailureKind.TIMEOUT:
        return Outcome.TIMEOUT
    if kind is FailureKind.SERVER_ERROR:
        return Outcome.FAILURE
    return None


@dataclass(frozen=True)
class FallbackPlan:
    primary: str  # the variant that serves by default (the optimized one)
    fallback: str | None = None  # the baseline recipe's variant
    max_attempts: int = 3  # attempts per request, all variants together


@dataclass(frozen=True)
class Attempt:
    variant: str
    replica_id: str


@dataclass(frozen=True)
class Retry:
    variant: str
    exclude: frozenset[str] = field(default_factory=frozenset)  # replicas this request already failed on
    is_fallback: bool = False  # counts toward tandem:fallback_total{variant=<the failed variant>}


@dataclass(frozen=True)
class ErrorEvent:
    """End the stream with an error event and `data: [DONE]` (the first byte was already sent)."""

    message: str
    code: str


@dataclass(frozen=True)
class Fail:
    status: int
    message: str


@dataclass(frozen=True)
class PassThrough:
    """Send the replica's own (client-error) response."""


Decision = Retry | ErrorEvent | Fail | PassThrough


def after_failure(
    plan: FallbackPlan,
    attempts: tuple[Attempt, ...],
    kind: FailureKind,
    first_byte_sent: bool,
    same_variant_left: int,
    fallback_available: bool = True,
    resumable: bool = False,
) -> Decision:
    """The next step after `attempts[-1]` failed with `kind`.

    `same_variant_left`: healthy replicas of the failed variant this request has not tried yet.
    `fallback_available`: the fallback variant has a replica that can take it now.
    `resumable`: a stream past its first byte that the gateway can continue elsewhere from what it
    relayed (tandem.gateway.resume): chosen like a request before its first byte.
    """
    last = attempts[-1]
    tried = frozenset(a.replica_id for a in attempts)
    if first_byte_sent and not resumable:
        return ErrorEvent(f"the replica serving this request failed mid-stream ({kind})", f"replica_{kind}")
    if kind is FailureKind.CLIENT_ERROR:
        return PassThrough()
    if len(attempts) >= plan.max_attempts:
        return Fail(503, f"the request failed on {len(attempts)} attempts (last: {kind} on {last.variant})")
    can_fall_back = plan.fallback is not None and last.variant != plan.fallback and fallback_available
    replica_problem = kind in (FailureKind.UNREACHABLE, FailureKind.UNAVAILABLE)
    if replica_problem and same_variant_left > 0:
        return Retry(last.variant, tried)
    if can_fall_back:
        return Retry(plan.fallback, tried, is_fallback=True)
    if same_variant_left > 0:
        return Retry(last.variant, tried)
    return Fail(503, f"no replica could serve the request ({kind} on {last.variant})")
