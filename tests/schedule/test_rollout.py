"""Rollout: `use(variant)` starts new replicas, shifts traffic, drains old ones; zero failed requests."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tandem.cluster import BackendError, FakeBackend
from tandem.schedule.controller import Controller, Pool
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.policies import ScaleLimits
from tandem.schedule.rollout import DrainVariant, Fleet, Phase, Rollout, StartReplicas, step, weights
from tandem.schedule.traffic import InFlight
from tandem.schedule.variant import Variant

from .fleet import Traffic
from .helpers import FakeClock

OLD, NEW, BASE = Variant("int8", "int8"), Variant("spec", "int8+speculative(k=4)"), Variant("baseline", "baseline")


def test_step_by_step():
    r = Rollout(old="a", new="b", target=2, started_at=0.0, shift_step=0.5)
    r, actions = step(r, Fleet(live={"a": 2}), 1.0)
    assert actions == (StartReplicas("b", 2),) and r.phase is Phase.STARTING and weights(r) == {"a": 1.0, "b": 0.0}
    r, actions = step(r, Fleet(live={"a": 2, "b": 2}, ready={"a": 2, "b": 1}), 2.0)
    assert actions == () and r.phase is Phase.STARTING  # both started, one not ready yet
    r, actions = step(r, Fleet(live={"a": 2, "b": 1}, ready={"a": 2, "b": 1}), 3.0)
    assert actions == (StartReplicas("b", 1),)  # one died: replaced
    r, actions = step(r, Fleet(live={"a": 2, "b": 2}, ready={"a": 2, "b": 2}), 4.0)
    assert r.phase is Phase.SHIFTING and weights(r) == {"a": 0.5, "b": 0.5} and actions == ()
    r, actions = step(r, Fleet(live={"a": 2, "b": 2}, ready={"a": 2, "b": 2}), 5.0)
    assert r.phase is Phase.DRAINING and weights(r) == {"a": 0.0, "b": 1.0} and actions == (DrainVariant("a"),)
    r, actions = step(r, Fleet(live={"b": 2}, ready={"b": 2}, draining={"a": 1}), 6.0)
    assert r.phase is Phase.DRAINING and actions == ()  # waiting for the last old one to finish
    r, _ = step(r, Fleet(live={"b": 2}, ready={"b": 2}), 7.0)
    assert r.phase is Phase.DONE and r.finished and weights(r) == {"b": 1.0}


def test_step_aborts_when_the_new_variant_never_gets_ready():
    r = Rollout(old="a", new="b", target=1, started_at=0.0, timeout_s=60.0)
    r, _ = step(r, Fleet(live={"a": 1, "b": 1}), 60.0)
    assert r.phase is Phase.STARTING
    r, actions = step(r, Fleet(live={"a": 1, "b": 1}), 61.0)
    assert r.phase is Phase.ABORTED and actions == (DrainVariant("b"),) and weights(r) == {"a": 1.0}


def build(startup_s=5.0, backend_type=FakeBackend):
    clock = FakeClock()
    backend = backend_type(clock, startup_s=startup_s)
    inflight = InFlight()
    limits = ScaleLimits(min_replicas=1, max_replicas=6)
    hold = lambda ctx: (max(ctx.current_replicas, ctx.limits.min_replicas), ctx.state)  # noqa: E731
    pools = [Pool(OLD, "hold", hold, ScaleLimits(min_replicas=3, max_replicas=6)), Pool(BASE, "hold", hold, limits)]
    metrics = SchedulerMetrics(CollectorRegistry())
    controller = Controller(backend, pools, clock, inflight.loads, primary="int8", metrics=metrics)
    return clock, backend, inflight, controller, metrics


def warm_up(clock, controller, seconds=6):
    controller.tick()
    for _ in range(seconds):  # the first replicas start before any traffic arrives
        clock.advance(1.0)
        controller.tick()


def run_until(clock, controller, traffic, until, per_tick=3, duration_s=3.0):
    while clock.now < until:
        clock.advance(1.0)
        traffic.finish(clock.now)
        traffic.send(per_tick, clock.now, duration_s)
        controller.tick()


def test_use_under_load_fails_zero_requests():
    clock, backend, inflight, controller, metrics = build()
    traffic = Traffic(backend, inflight, controller)
    warm_up(clock, controller)
    run_until(clock, controller, traffic, 20)
    assert sorted(r.variant for r in backend.list()) == ["baseline"] + ["int8"] * 3
    rollout = controller.use(NEW)
    assert rollout.target == 3
    with pytest.raises(RuntimeError, match="under way"):
        controller.use(Variant("other", "bf16"))
    run_until(clock, controller, traffic, 60)
    assert controller.rollout.phase is Phase.DONE and controller.primary == "spec"
    assert controller.weights() == {"spec": 1.0}
    assert sorted(r.variant for r in backend.list()) == ["baseline"] + ["spec"] * 3
    assert set(controller.pools) == {"spec", "baseline"}
    run_until(clock, controller, traffic, 80)
    assert traffic.failed == 0 and traffic.cut == []
    assert traffic.served_by["int8"] > 0 and traffic.served_by["spec"] > 0
    assert traffic.served_by.get("baseline", 0) == 0  # the fallback took no primary traffic
    stopped = [r.variant for r in backend.stopped]
    assert stopped == ["int8"] * 3
    value = metrics.registry.get_sample_value
    assert value("tandem:replicas", {"variant": "spec", "state": "ready"}) == 3


def test_use_refuses_the_variant_that_already_serves():
    _, _, _, controller, _ = build()
    with pytest.raises(ValueError, match="already serves"):
        controller.use(OLD)


def test_use_promotes_an_existing_pool_to_the_primarys_size():
    clock, backend, inflight, controller, _ = build()
    traffic = Traffic(backend, inflight, controller)
    warm_up(clock, controller)
    controller.use(BASE)  # e.g. a candidate the gate validated, or the fallback in an emergency
    run_until(clock, controller, traffic, 40)
    assert controller.rollout.phase is Phase.DONE and controller.primary == "baseline"
    assert sorted(r.variant for r in backend.list()) == ["baseline"] * 3  # grown to int8's 3 before traffic moved
    assert set(controller.pools) == {"baseline"} and controller.pools["baseline"].limits.min_replicas == 3
    assert traffic.failed == 0 and traffic.cut == []


def test_a_rollout_whose_replicas_fail_to_start_is_aborted_with_their_error():
    clock, backend, inflight, controller, _ = build()
    traffic = Traffic(backend, inflight, controller)
    warm_up(clock, controller)
    controller.use(NEW)
    for _ in range(30):
        for replica in backend.list():
            if replica.variant == "spec":
                backend.crash(replica.replica_id, 1, "Error: bad parameter for optimizer 'speculative'")
        clock.advance(1.0)
        traffic.finish(clock.now)
        traffic.send(2, clock.now, 2.0)
        controller.tick()
    rollout = controller.rollout
    assert rollout.phase is Phase.ABORTED and "bad parameter for optimizer 'speculative'" in rollout.reason
    assert controller.primary == "int8" and "spec" not in controller.pools and controller.fatal is None
    assert traffic.failed == 0 and traffic.cut == []


class RefusingNew(FakeBackend):
    """Starts of the new variant fail before any process exists, as a log file name too long made them."""

    def start(self, spec):
        if spec.variant != NEW.name:
            return super().start(spec)
        self.calls.append(("start", spec.variant))
        raise BackendError("cannot start replica spec-9: [Errno 36] File name too long: '/logs/spec-9.log'",
                           replica_id="spec-9")  # fmt: skip


def test_a_rollout_whose_starts_fail_before_any_process_exists_is_aborted_within_seconds_with_why():
    clock, backend, inflight, controller, metrics = build(backend_type=RefusingNew)
    traffic = Traffic(backend, inflight, controller)
    warm_up(clock, controller)
    controller.use(NEW)
    started_at = clock.now
    while not controller.rollout.finished and clock.now - started_at < 600:
        clock.advance(1.0)
        traffic.finish(clock.now)
        traffic.send(2, clock.now, 2.0)
        controller.tick()
    rollout = controller.rollout
    assert rollout.phase is Phase.ABORTED and "File name too long" in rollout.reason, rollout
    assert clock.now - started_at <= 10  # three tries, 1 s then 2 s apart: not the 600 s timeout
    assert backend.calls.count(("start", "spec")) == 3  # backed off between them, not once a tick
    assert controller.starts["spec"].failures == 3 and "File name too long" in controller.starts["spec"].last_error
    (exit_,) = [e for e in controller.recent_exits if e.replica.variant == "spec"][-1:]
    assert exit_.replica.replica_id == "spec-9" and exit_.code is None and "File name too long" in exit_.error
    assert metrics.registry.get_sample_value("tandem:replica_restarts_total", {"variant": "spec"}) == 3
    assert controller.primary == "int8" and controller.fatal is None
    assert traffic.failed == 0 and traffic.cut == []


def test_an_aborted_promotion_gives_the_pool_back_its_own_sizing():
    clock, backend, inflight, controller, _ = build(startup_s=5.0)
    warm_up(clock, controller)
    before = controller.pools["baseline"]
    controller.use(BASE, timeout_s=1.0)  # baseline needs 2 more replicas; they take 5 s: too late
    for _ in range(10):
        clock.advance(1.0)
        controller.tick()
    assert controller.rollout.phase is Phase.ABORTED and controller.primary == "int8"
    assert controller.pools["baseline"] == before and any(r.variant == "baseline" for r in backend.list())


def test_an_aborted_rollout_leaves_the_old_variant_serving():
    clock, backend, inflight, controller, _ = build(startup_s=1e9)  # nothing ever gets ready...
    backend._startup = lambda spec: 5.0 if spec.variant != "spec" else 1e9  # ...except the old variants
    traffic = Traffic(backend, inflight, controller)
    warm_up(clock, controller)
    run_until(clock, controller, traffic, 10)
    controller.use(NEW, timeout_s=30.0)
    run_until(clock, controller, traffic, 50)
    assert controller.rollout.phase is Phase.ABORTED and "not ready within 30 s" in controller.rollout.reason
    assert controller.primary == "int8" and "spec" not in controller.pools
    assert sorted(r.variant for r in backend.list()) == ["baseline"] + ["int8"] * 3
    assert traffic.failed == 0 and traffic.cut == []
