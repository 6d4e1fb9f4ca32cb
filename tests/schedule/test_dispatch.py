"""The Dispatcher on a fake fleet: the fault tests of issue 6 at unit level (fake clock, no sleeping).

(a) 20% injected failures on the optimized variant: no client-visible error, fallbacks counted, the
    breaker opens, then half-opens and closes once the fault stops;
(b) a replica killed under load: every request that had not started streaming is re-run and served;
    those already streaming end with an error event;
plus weighted variant choice during a rollout and breaker diversion.
"""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry

from tandem.cluster import FakeBackend, ReplicaSpec
from tandem.schedule.breaker import BreakerBoard, BreakerConfig, BreakerMode
from tandem.schedule.dispatch import Dispatcher
from tandem.schedule.fallback import ErrorEvent, Fail, FailureKind, FallbackPlan, Retry
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.routers import LeastOutstanding, RouteRequest

from .helpers import FakeClock


def fleet(fast=2, baseline=1, weights=None, breaker=BreakerConfig()):
    clock = FakeClock()
    backend = FakeBackend(clock)
    for variant, count in (("fast", fast), ("baseline", baseline)):
        for _ in range(count):
            replica = backend.start(ReplicaSpec(variant=variant, recipe=variant))
            backend.health(replica.replica_id)
    metrics = SchedulerMetrics(CollectorRegistry())
    dispatcher = Dispatcher(
        backend,
        LeastOutstanding(),
        BreakerBoard(breaker, clock),
        FallbackPlan(primary="fast", fallback="baseline"),
        weights=lambda: weights or {"fast": 1.0},
        metrics=metrics,
        rng=random.Random(0),
        clock=clock,
    )
    return clock, backend, dispatcher, metrics


def serve(dispatcher, fails_first_byte) -> str:
    """One request through the dispatcher; `fails_first_byte(target)` says whether that attempt fails
    before its first byte. Returns 'ok', 'error-event' or 'failed'."""
    target = dispatcher.pick(RouteRequest())
    attempts = [target]
    while True:
        if target is None:
            return "failed"
        if not fails_first_byte(target):
            dispatcher.succeeded(target, prompt_tokens=10, output_tokens=20)
            return "ok"
        decision = dispatcher.failed(attempts, FailureKind.SERVER_ERROR, first_byte_sent=False)
        if not isinstance(decision, Retry):
            return "failed"
        target = dispatcher.pick(RouteRequest(exclude=decision.exclude), variant=decision.variant)
        attempts.append(target)


def test_a_injected_faults_are_invisible_and_the_breaker_opens_half_opens_and_closes():
    config = BreakerConfig(consecutive_failures=5, failure_ratio=0.1, window_s=10, min_calls=20, open_s=5)
    clock, _, dispatcher, metrics = fleet(breaker=config)
    rng = random.Random(42)
    fault = {"on": True}
    outcomes, modes = [], []
    for tick in range(300):  # 30 s at 10 requests/s; the fault stops at 15 s
        clock.now = tick / 10
        if clock.now >= 15.0:
            fault["on"] = False
        outcomes.append(serve(dispatcher, lambda t: t.variant == "fast" and fault["on"] and rng.random() < 0.2))
        modes.append(dispatcher.breakers.mode("fast"))
    assert outcomes.count("ok") == 300  # zero client-visible errors
    fallbacks = metrics.registry.get_sample_value("tandem:fallback_total", {"variant": "fast"})
    assert fallbacks >= 10
    first_open = modes.index(BreakerMode.OPEN)
    assert first_open < 150  # tripped while the fault was on
    assert BreakerMode.HALF_OPEN in modes[first_open:]
    assert modes[-1] is BreakerMode.CLOSED  # closed again once the fault stopped
    assert metrics.registry.get_sample_value("tandem:breaker_state", {"variant": "fast"}) == 0
    # While open, the optimized variant got no traffic; after it closed, it got it back.
    assert dispatcher.demand.rate("fast", clock.now).output_tokens_per_s > 0


def test_b_a_killed_replica_loses_no_request_that_had_not_started_streaming():
    clock, backend, dispatcher, _ = fleet(fast=3, baseline=1)
    in_flight = [dispatcher.pick(RouteRequest()) for _ in range(12)]
    streaming = {id(t) for t in in_flight[::2]}  # half of them already sent their first byte
    victim = in_flight[0].replica_id
    backend.crash(victim)
    results = {"ok": 0, "error-event": 0, "failed": 0}
    for target in in_flight:
        if target.replica_id != victim:
            dispatcher.succeeded(target)
            results["ok"] += 1
            continue
        started = id(target) in streaming
        decision = dispatcher.failed([target], FailureKind.UNREACHABLE, first_byte_sent=started)
        if isinstance(decision, ErrorEvent):
            results["error-event"] += 1
            continue
        assert isinstance(decision, Retry) and decision.variant == "fast"  # another replica of the same variant
        retry = dispatcher.pick(RouteRequest(exclude=decision.exclude), variant=decision.variant)
        assert retry is not None and retry.replica_id != victim
        dispatcher.succeeded(retry)
        results["ok"] += 1
    on_victim = [t for t in in_flight if t.replica_id == victim]
    assert results["failed"] == 0
    assert results["error-event"] == sum(1 for t in on_victim if id(t) in streaming)
    assert results["ok"] == 12 - results["error-event"]
    assert dispatcher.breakers.mode("fast") is BreakerMode.CLOSED  # a dead replica is not the variant's fault


def test_open_breaker_diverts_to_the_fallback_and_counts_it():
    config = BreakerConfig(consecutive_failures=1, open_s=60)
    clock, _, dispatcher, metrics = fleet(breaker=config)
    target = dispatcher.pick(RouteRequest())
    decision = dispatcher.failed([target], FailureKind.TIMEOUT, first_byte_sent=False)
    assert decision == Retry("baseline", frozenset({target.replica_id}), is_fallback=True)
    diverted = dispatcher.pick(RouteRequest())
    assert diverted.variant == "baseline" and diverted.diverted
    assert metrics.registry.get_sample_value("tandem:fallback_total", {"variant": "fast"}) == 2
    assert metrics.registry.get_sample_value("tandem:breaker_state", {"variant": "fast"}) == 2


def test_no_fallback_replica_means_the_open_variant_is_tried_anyway():
    clock, _, dispatcher, _ = fleet(baseline=0, breaker=BreakerConfig(consecutive_failures=1, open_s=60))
    target = dispatcher.pick(RouteRequest())
    assert isinstance(dispatcher.failed([target], FailureKind.SERVER_ERROR, False), Retry)  # the other fast one
    assert dispatcher.pick(RouteRequest()).variant == "fast"


def test_nothing_ready_returns_none_and_exhausted_retries_fail():
    clock, backend, dispatcher, _ = fleet(fast=0, baseline=0)
    assert dispatcher.pick(RouteRequest()) is None
    clock, backend, dispatcher, _ = fleet(fast=1, baseline=0)
    target = dispatcher.pick(RouteRequest())
    assert isinstance(dispatcher.failed([target], FailureKind.SERVER_ERROR, False), Fail)
    assert dispatcher.inflight.running == {}


def test_weights_split_traffic_during_a_rollout():
    clock, backend, dispatcher, _ = fleet(fast=1, baseline=1, weights={"fast": 0.25, "new": 0.75})
    for _ in range(2):
        backend.health(backend.start(ReplicaSpec(variant="new", recipe="new")).replica_id)
    picks = [dispatcher.pick(RouteRequest()) for _ in range(400)]
    for target in picks:
        dispatcher.succeeded(target)
    share = sum(1 for t in picks if t.variant == "new") / len(picks)
    assert 0.68 < share < 0.82
    assert all(t.variant != "baseline" for t in picks)


def test_an_unreachable_replica_is_skipped_for_a_few_seconds():
    clock, backend, dispatcher, _ = fleet(fast=2, baseline=0)
    first = dispatcher.pick(RouteRequest())
    dispatcher.failed([first], FailureKind.UNREACHABLE, False)
    for _ in range(5):
        target = dispatcher.pick(RouteRequest())
        assert target.replica_id != first.replica_id
        dispatcher.succeeded(target)
    clock.advance(dispatcher.inflight.unreachable_s)
    assert first.replica_id in {dispatcher.pick(RouteRequest()).replica_id for _ in range(2)}


def test_only_admitted_attempts_count_for_a_half_open_breaker():
    config = BreakerConfig(consecutive_failures=1, open_s=5, half_open_probes=1, half_open_successes=1)
    clock, _, dispatcher, _ = fleet(breaker=config)
    first = dispatcher.pick(RouteRequest())
    dispatcher.failed([first], FailureKind.SERVER_ERROR, False)
    clock.advance(5.0)
    probe = dispatcher.pick(RouteRequest())
    assert probe.variant == "fast" and probe.counted
    assert dispatcher.pick(RouteRequest()).variant == "baseline"  # the probe slot is taken: diverted
    extra = dispatcher.pick(RouteRequest(), variant="fast")  # a retry sent there anyway
    assert not extra.counted
    dispatcher.succeeded(extra)
    assert dispatcher.breakers.mode("fast") is BreakerMode.HALF_OPEN  # an uncounted success closes nothing
    dispatcher.succeeded(probe)
    assert dispatcher.breakers.mode("fast") is BreakerMode.CLOSED
