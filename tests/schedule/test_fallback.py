"""Fallback decisions: re-run before the first byte, an error event after it."""

from __future__ import annotations

import pytest

from tandem.schedule.breaker import Outcome
from tandem.schedule.fallback import (
    Attempt,
    ErrorEvent,
    Fail,
    FailureKind,
    FallbackPlan,
    PassThrough,
    Retry,
    after_failure,
    breaker_outcome,
    classify_status,
)

PLAN = FallbackPlan(primary="fast", fallback="baseline", max_attempts=3)
ON_FAST = (Attempt("fast", "fast-1"),)


@pytest.mark.parametrize("kind", [FailureKind.SERVER_ERROR, FailureKind.TIMEOUT])
def test_variant_failure_before_first_byte_reruns_on_the_fallback(kind):
    decision = after_failure(PLAN, ON_FAST, kind, first_byte_sent=False, same_variant_left=3)
    assert decision == Retry("baseline", frozenset({"fast-1"}), is_fallback=True)


@pytest.mark.parametrize("kind", list(FailureKind))
def test_any_failure_after_the_first_byte_is_an_error_event(kind):
    decision = after_failure(PLAN, ON_FAST, kind, first_byte_sent=True, same_variant_left=3)
    assert isinstance(decision, ErrorEvent) and decision.code == f"replica_{kind}" and kind in decision.message


def test_a_resumable_stream_after_its_first_byte_goes_where_a_fresh_request_would():
    dead = after_failure(PLAN, ON_FAST, FailureKind.UNREACHABLE, True, same_variant_left=1, resumable=True)
    assert dead == Retry("fast", frozenset({"fast-1"}))
    failing = after_failure(PLAN, ON_FAST, FailureKind.SERVER_ERROR, True, same_variant_left=1, resumable=True)
    assert failing == Retry("baseline", frozenset({"fast-1"}), is_fallback=True)
    nowhere = after_failure(PLAN, ON_FAST, FailureKind.TIMEOUT, True, 0, fallback_available=False, resumable=True)
    assert isinstance(nowhere, Fail)


def test_a_dead_or_busy_replica_tries_another_replica_of_the_same_variant_first():
    for kind in (FailureKind.UNREACHABLE, FailureKind.UNAVAILABLE):
        assert after_failure(PLAN, ON_FAST, kind, False, same_variant_left=1) == Retry("fast", frozenset({"fast-1"}))
        assert after_failure(PLAN, ON_FAST, kind, False, same_variant_left=0) == Retry(
            "baseline", frozenset({"fast-1"}), is_fallback=True
        )


def test_client_errors_pass_through():
    assert isinstance(after_failure(PLAN, ON_FAST, FailureKind.CLIENT_ERROR, False, 3), PassThrough)


def test_attempts_are_bounded():
    attempts = (Attempt("fast", "fast-1"), Attempt("baseline", "baseline-1"), Attempt("baseline", "baseline-2"))
    decision = after_failure(PLAN, attempts, FailureKind.UNREACHABLE, False, same_variant_left=5)
    assert isinstance(decision, Fail) and decision.status == 503


def test_failure_on_the_fallback_has_nowhere_else_to_fall():
    attempts = (Attempt("fast", "fast-1"), Attempt("baseline", "baseline-1"))
    assert isinstance(after_failure(PLAN, attempts, FailureKind.SERVER_ERROR, False, 0), Fail)
    assert after_failure(PLAN, attempts, FailureKind.SERVER_ERROR, False, 1) == Retry(
        "baseline", frozenset({"fast-1", "baseline-1"})
    )


def test_without_a_fallback_the_same_variant_is_retried_elsewhere():
    plan = FallbackPlan(primary="fast")
    assert after_failure(plan, ON_FAST, FailureKind.SERVER_ERROR, False, 1) == Retry("fast", frozenset({"fast-1"}))
    assert isinstance(after_failure(plan, ON_FAST, FailureKind.SERVER_ERROR, False, 0), Fail)
    unavailable = after_failure(PLAN, ON_FAST, FailureKind.SERVER_ERROR, False, 0, fallback_available=False)
    assert isinstance(unavailable, Fail)


def test_status_classification_and_breaker_outcomes():
    assert classify_status(200) is None
    assert classify_status(429) is FailureKind.UNAVAILABLE and classify_status(503) is FailureKind.UNAVAILABLE
    assert classify_status(500) is FailureKind.SERVER_ERROR and classify_status(400) is FailureKind.CLIENT_ERROR
    assert breaker_outcome(FailureKind.TIMEOUT) is Outcome.TIMEOUT
    assert breaker_outcome(FailureKind.SERVER_ERROR) is Outcome.FAILURE
    assert breaker_outcome(FailureKind.UNREACHABLE) is None and breaker_outcome(FailureKind.CLIENT_ERROR) is None
