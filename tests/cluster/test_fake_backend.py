"""FakeBackend: replicas as records on a fake clock, with crash and health fault injection."""

from __future__ import annotations

import pytest

from tandem.cluster import Backend, BackendError, FakeBackend, ReplicaSpec, ReplicaState


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


SPEC = ReplicaSpec(variant="fast", recipe="int8")


def test_lifecycle_starting_ready_draining_stopped():
    clock = Clock()
    backend = FakeBackend(clock, startup_s=5.0)
    assert isinstance(backend, Backend)
    replica = backend.start(SPEC)
    assert replica.state is ReplicaState.STARTING and replica.live
    assert backend.health(replica.replica_id) is False  # still loading
    clock.now = 5.0
    assert backend.health(replica.replica_id) is True
    assert backend.list()[0].state is ReplicaState.READY
    backend.drain(replica.replica_id)
    assert backend.list()[0].state is ReplicaState.DRAINING and not backend.list()[0].live
    backend.stop(replica.replica_id)
    assert backend.list() == []
    assert backend.stopped[0].state is ReplicaState.STOPPED
    assert backend.calls == [("start", "fast"), ("drain", "fast-1"), ("stop", "fast-1")]


def test_startup_time_per_spec_and_capacity():
    clock = Clock()
    backend = FakeBackend(clock, startup_s=lambda spec: 1.0 if spec.recipe == "baseline" else 9.0, capacity=2)
    slow = backend.start(SPEC)
    quick = backend.start(ReplicaSpec(variant="baseline", recipe="baseline"))
    with pytest.raises(BackendError, match="capacity"):
        backend.start(SPEC)
    clock.now = 1.0
    assert backend.health(quick.replica_id) and not backend.health(slow.replica_id)


def test_crash_and_unhealthy():
    clock = Clock()
    backend = FakeBackend(clock)
    a, b = backend.start(SPEC), backend.start(SPEC)
    backend.set_healthy(a.replica_id, False)
    assert backend.health(a.replica_id) is False and backend.health(b.replica_id) is True
    backend.crash(b.replica_id)
    assert [r.replica_id for r in backend.list()] == [a.replica_id]
    assert backend.stopped[-1].exit_code == -9
    assert backend.health(b.replica_id) is False
    backend.stop(b.replica_id)  # stopping a crashed replica is harmless
    with pytest.raises(BackendError):
        backend.drain("nope")


def test_spec_validation():
    with pytest.raises(ValueError):
        ReplicaSpec(variant="", recipe="x")
    with pytest.raises(ValueError):
        ReplicaSpec(variant="v", recipe="x", threads=0)
