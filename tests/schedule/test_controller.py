"""The controller on a FakeBackend and a fake clock: scale up and down, drain before stop, replace
dead replicas, regions, metrics; a burst scales 1 -> N -> 1 without failing a request."""

from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry

from tandem.cluster import FakeBackend, ReplicaState
from tandem.contracts import ReplicaLoad
from tandem.schedule.controller import Controller, ControllerConfig, Pool
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.policies import HpaParams, KpaParams, PolicyState, ScaleLimits, hpa, kpa, kpa_limits
from tandem.schedule.traffic import InFlight
from tandem.schedule.variant import Variant

from .fleet import Traffic
from .helpers import FakeClock

FAST = Variant("fast", "int8")
LIMITS = ScaleLimits(min_replicas=1, max_replicas=6, max_scale_up_rate=1000, max_scale_down_rate=1000)


class Scripted:
    """A policy that returns whatever the test sets (and records what it was shown)."""

    def __init__(self, desired: int = 1) -> None:
        self.desired = desired
        self.seen = []

    def __call__(self, ctx):
        self.seen.append(ctx)
        return self.desired, ctx.state


def build(policy, limits=LIMITS, startup_s=0.0, regions=("local",), config=ControllerConfig(), **kwargs):
    clock = FakeClock()
    backend = FakeBackend(clock, startup_s=startup_s)
    inflight = InFlight()
    metrics = SchedulerMetrics(CollectorRegistry())
    pool = Pool(FAST, "scripted", policy, limits, regions)
    controller = Controller(
        backend,
        [pool],
        clock,
        inflight.loads,
        metrics=metrics,
        config=config,
        buffered=inflight.buffered.__getitem__,
        **kwargs,
    )
    return clock, backend, inflight, controller, metrics


def states(backend):
    return sorted(r.state.value for r in backend.list())


def test_scale_up_starts_replicas_that_become_ready_when_they_answer():
    policy = Scripted(3)
    clock, backend, _, controller, _ = build(policy, startup_s=5.0)
    report = controller.tick()
    assert report.started == ["fast-1", "fast-2", "fast-3"] and report.desired == {"fast": (0, 3)}
    assert states(backend) == ["starting"] * 3
    clock.advance(5.0)
    controller.tick()
    assert states(backend) == ["ready"] * 3
    assert policy.seen[-1].current_replicas == 3 and policy.seen[-1].ready_replicas == 3


def test_scale_down_drains_then_stops_only_when_idle():
    policy = Scripted(3)
    clock, backend, inflight, controller, _ = build(policy)
    controller.tick()
    controller.tick()  # all ready
    inflight.begin("fast-1")
    inflight.begin("fast-1")
    inflight.begin("fast-2")
    policy.desired = 1
    report = controller.tick()
    assert report.drained == ["fast-3", "fast-2"]  # the least busy go first; fast-1 (2 in flight) stays
    assert report.stopped == []  # never stopped in the tick it was drained
    clock.advance(1.0)
    assert controller.tick().stopped == ["fast-3"]  # idle: stopped
    assert controller.tick().stopped == []  # fast-2 still has a request in flight
    inflight.end("fast-2")
    assert controller.tick().stopped == ["fast-2"]
    assert [r.replica_id for r in backend.list()] == ["fast-1"]
    for op, rid in backend.calls:
        if op == "stop":
            assert ("drain", rid) in backend.calls[: backend.calls.index((op, rid))]


def test_a_replica_that_fails_to_start_is_restarted_with_exponential_backoff():
    policy = Scripted(1)
    config = ControllerConfig(start_attempts=3, restart_backoff_s=1.0, restart_backoff_max_s=60.0)
    clock, backend, _, controller, metrics = build(policy, startup_s=5.0, config=config)
    assert controller.tick().started == ["fast-1"]
    backend.crash("fast-1", exit_code=1, output="INFO loading\n2026 ERROR tandem.serve: cannot serve: bad recipe\n")
    assert controller.tick().started == []  # backing off: 1 s
    assert controller.starts["fast"].last_error.endswith("cannot serve: bad recipe")
    clock.advance(1.0)
    assert controller.tick().started == ["fast-2"]
    backend.crash("fast-2", exit_code=1)
    assert controller.tick().started == []  # noticed now: the second failure in a row waits 2 s
    clock.advance(1.0)
    assert controller.tick().started == []
    clock.advance(1.0)
    assert controller.tick().started == ["fast-3"]
    assert controller.fatal is None
    assert metrics.registry.get_sample_value("tandem:replica_restarts_total", {"variant": "fast"}) == 2


def test_the_primary_gives_up_with_the_replicas_own_error_after_its_attempts():
    clock, backend, _, controller, _ = build(Scripted(1), startup_s=5.0, config=ControllerConfig(start_attempts=3))
    for attempt in range(3):
        (started,) = controller.tick().started
        backend.crash(started, exit_code=1, output=f"Error: bad parameter for optimizer 'speculative' ({attempt})")
        controller.tick()  # noticed
        assert (controller.fatal is None) == (attempt < 2)
        clock.advance(60.0)
    assert "'fast'" in controller.fatal and "bad parameter for optimizer 'speculative' (2)" in controller.fatal


def test_starts_the_backend_refuses_are_counted_backed_off_and_end_in_giving_up_with_why():
    clock = FakeClock()
    backend = FakeBackend(clock, capacity=0)  # every start raises BackendError: no process ever exists
    controller = Controller(backend, [Pool(FAST, "scripted", Scripted(1), LIMITS)], clock, InFlight().loads)
    for _ in range(6):  # 6 s of ticks: tries at 0, 1 and 3 s, given up since the third
        controller.tick()
        clock.advance(1.0)
    assert backend.calls.count(("start", "fast")) == 3
    assert controller.starts["fast"].failures == 3
    assert controller.fatal is not None and "no room for another replica (capacity 0)" in controller.fatal
    assert [e.error for e in controller.recent_exits] == ["no room for another replica (capacity 0)"] * 3


def test_a_backend_bug_on_start_is_a_failed_start_too(caplog):
    class Broken(FakeBackend):
        def start(self, spec):
            raise TypeError("start() got an unexpected keyword")

    clock = FakeClock()
    controller = Controller(Broken(clock), [Pool(FAST, "scripted", Scripted(1), LIMITS)], clock, InFlight().loads)
    controller.tick()
    assert controller.starts["fast"].failures == 1 and controller.starts["fast"].retry_at == clock.now + 1.0
    assert controller.starts["fast"].last_error == "TypeError: start() got an unexpected keyword"
    assert controller.recent_exits[-1].replica.replica_id == "(unnamed)"


def test_a_replica_that_once_got_ready_resets_the_backoff_and_its_crash_is_replaced_at_once():
    clock, backend, _, controller, metrics = build(Scripted(1), config=ControllerConfig(start_attempts=2))
    controller.tick()
    backend.crash("fast-1", exit_code=1)  # a startup failure
    controller.tick()
    clock.advance(1.0)
    assert controller.tick().started == ["fast-2"]
    controller.tick()  # fast-2 answers: ready
    assert controller.starts["fast"].failures == 0 and controller.starts["fast"].ever_ready
    backend.crash("fast-2", exit_code=-9, output="Killed")
    assert controller.tick().started == ["fast-3"]  # no backoff after a ready replica died
    for _ in range(3):  # failing starts now never make the gateway give up: it served before
        backend.crash(backend.list()[0].replica_id, exit_code=1)
        controller.tick()
        clock.advance(120.0)
        assert len(controller.tick().started) == 1
    assert controller.fatal is None
    assert metrics.registry.get_sample_value("tandem:replica_restarts_total", {"variant": "fast"}) == 5


def test_loads_the_replicas_report_reach_the_policy():
    policy = Scripted(2)
    clock, backend, inflight, controller, _ = build(policy)
    controller.tick()
    controller.tick()
    inflight.report(ReplicaLoad("fast-1", "local", "fast", running=6, waiting=2, kv_used=0.75, healthy=True))
    inflight.begin("fast-2")
    controller.tick()
    loads = {load.replica_id: load for load in policy.seen[-1].loads}
    assert (loads["fast-1"].running, loads["fast-1"].waiting, loads["fast-1"].kv_used) == (6, 2, 0.75)
    assert (loads["fast-2"].running, loads["fast-2"].kv_used) == (1, 0.0)  # no report: the gateway's count
    assert policy.seen[-1].in_flight == 9


def test_the_least_busy_ready_replica_is_drained_and_starting_ones_go_first():
    policy = Scripted(2)
    clock, backend, inflight, controller, _ = build(policy, startup_s=10.0)
    controller.tick()
    clock.advance(10.0)
    controller.tick()
    inflight.begin("fast-1")
    policy.desired = 1
    assert controller.tick().drained == ["fast-2"]  # fast-1 is busy
    policy.desired = 3
    assert controller.tick().started == ["fast-3", "fast-4"]  # fast-2 is draining: it no longer counts
    clock.advance(1.0)
    policy.desired = 1
    report = controller.tick()
    assert sorted(report.stopped) == ["fast-3", "fast-4"] and report.drained == []  # starting: stopped at once


def test_drain_timeout_stops_a_stuck_replica():
    policy = Scripted(2)
    clock, backend, inflight, controller, _ = build(policy, config=ControllerConfig(drain_timeout_s=30.0))
    controller.tick()
    controller.tick()
    inflight.begin("fast-1")
    inflight.begin("fast-2")
    policy.desired = 1
    drained = controller.tick().drained
    clock.advance(29.0)
    assert controller.tick().stopped == []
    clock.advance(1.0)
    assert controller.tick().stopped == drained


def test_dead_and_stuck_replicas_are_replaced():
    policy = Scripted(2)
    clock, backend, _, controller, _ = build(policy, config=ControllerConfig(unhealthy_after=3, start_timeout_s=60))
    controller.tick()
    controller.tick()
    backend.crash("fast-1")
    report = controller.tick()
    assert report.started == ["fast-3"]  # the policy still wants 2
    backend.set_healthy("fast-2", False)
    controller.tick()
    controller.tick()
    report = controller.tick()  # third failed probe in a row
    assert "fast-2" in report.stopped and report.started == ["fast-4"]
    backend.set_healthy("fast-4", False)  # never answers: stuck starting
    clock.advance(61.0)
    report = controller.tick()
    assert "fast-4" in report.stopped


def test_regions_are_filled_evenly_and_emptied_evenly():
    policy = Scripted(4)
    clock, backend, _, controller, _ = build(policy, regions=("us", "eu"))
    controller.tick()
    controller.tick()
    assert sorted(r.region for r in backend.list()) == ["eu", "eu", "us", "us"]
    policy.desired = 2
    controller.tick()
    clock.advance(1.0)
    controller.tick()
    assert sorted(r.region for r in backend.list()) == ["eu", "us"]


def test_metrics_count_replicas_and_decisions():
    policy = Scripted(2)
    clock, backend, _, controller, metrics = build(policy, startup_s=5.0)
    controller.tick()
    value = metrics.registry.get_sample_value
    assert value("tandem:replicas", {"variant": "fast", "state": "starting"}) == 2
    assert value("tandem:scale_decisions_total", {"policy": "scripted", "direction": "up"}) == 1
    clock.advance(5.0)
    controller.tick()
    assert value("tandem:replicas", {"variant": "fast", "state": "ready"}) == 2
    assert value("tandem:replicas", {"variant": "fast", "state": "starting"}) == 0
    policy.desired = 1
    controller.tick()
    assert value("tandem:replicas", {"variant": "fast", "state": "draining"}) == 1
    assert value("tandem:scale_decisions_total", {"policy": "scripted", "direction": "down"}) == 1


def test_a_burst_scales_one_to_n_and_back_without_failing_a_request():
    """HPA on the fake fleet: 1 replica, a 2-minute burst, then quiet; every request is served."""
    limits = ScaleLimits(min_replicas=1, max_replicas=8, max_scale_up_rate=2.0, scale_up_step=4)
    policy = functools.partial(hpa, params=HpaParams(target=4, scale_down_stabilization_s=60))
    clock, backend, inflight, controller, _ = build(policy, limits=limits, startup_s=3.0)
    traffic = Traffic(backend, inflight, controller)
    counts = []
    controller.tick()
    while clock.now < 400:
        clock.advance(1.0)
        traffic.finish(clock.now)
        if 20 <= clock.now < 140:
            traffic.send(8, clock.now, duration_s=4.0)  # ~32 in flight: wants 8 replicas at 4 each
        elif clock.now % 5 == 0:
            traffic.send(1, clock.now, duration_s=2.0)
        controller.tick()
        counts.append(sum(1 for r in backend.list() if r.live))
    assert counts[0] == 1 and max(counts) == 8 and counts[-1] == 1
    assert traffic.failed == 0 and traffic.cut == [] and traffic.served > 900


def test_kpa_scales_to_zero_and_back_from_a_buffered_request():
    params = KpaParams(target_concurrency=4, target_utilization=1.0)
    clock, backend, inflight, controller, _ = build(functools.partial(kpa, params=params), limits=kpa_limits(0, 4))
    controller.tick()
    assert backend.list() == []  # nothing to serve, nothing started
    inflight.buffered["fast"] = 1  # a request waits at the gateway
    clock.advance(2.0)
    assert controller.tick().started == ["fast-1"]
    inflight.buffered["fast"] = 0
    for _ in range(60):
        clock.advance(2.0)
        controller.tick()
    assert backend.list() == [] and [r.replica_id for r in backend.stopped] == ["fast-1"]
    assert isinstance(controller.states["fast"], PolicyState)


def test_draining_replicas_are_not_routable():
    policy = Scripted(2)
    clock, backend, inflight, controller, _ = build(policy)
    controller.tick()
    controller.tick()
    policy.desired = 1
    drained = controller.tick().drained
    loads = inflight.loads(backend.list())
    assert [rid for rid, load in loads.items() if not load.healthy] == drained
    assert backend.list()[0].state in (ReplicaState.READY, ReplicaState.DRAINING)
