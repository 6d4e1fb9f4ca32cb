"""FakeBackend: replicas as records on a fake clock, with crash and health fault injection."""

from __future__ import annotations

import pytest

from tandem.cluster import Backend, BackendError, FakeBackend, ReplicaSpec, ReplicaState
from tandem.cluster.room import NodeBudget


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


MiB = 1 << 20


def sized(variant: str, mib: int) -> ReplicaSpec:
    return ReplicaSpec(variant=variant, recipe="baseline", memory_bytes=mib * MiB)


def test_a_replica_that_does_not_fit_waits_pending_and_is_placed_once_room_frees():
    clock = Clock()
    backend = FakeBackend(clock, startup_s=5.0, memory_bytes=1000 * MiB)
    a = backend.start(sized("a", 600))
    b = backend.start(sized("b", 500))
    assert a.pending is None and a.url and b.pending is not None and not b.url
    assert b.state is ReplicaState.STARTING and b.pending.reason == "no room: needs 500 MiB, free 400 MiB on node local"
    assert [r.replica_id for r in backend.list()] == [a.replica_id, b.replica_id]
    assert backend.health(b.replica_id) is False
    (room,) = backend.room()
    assert room.used_bytes == 600 * MiB
    clock.now = 10.0
    backend.stop(a.replica_id)
    assert [e.replica.replica_id for e in backend.exits()] == [a.replica_id]  # and b is placed
    (placed,) = backend.list()
    assert placed.replica_id == b.replica_id and placed.pending is None and placed.node == "local"
    assert placed.started_at == 10.0  # its start (and its startup_s) counts from its placement
    clock.now = 14.0
    assert not backend.health(b.replica_id)
    clock.now = 15.0
    assert backend.health(b.replica_id)


def test_waiting_replicas_go_largest_first_and_a_stopped_one_just_leaves():
    clock = Clock()
    backend = FakeBackend(clock, nodes=[NodeBudget("n1", 1000 * MiB), NodeBudget("n2", 300 * MiB)])
    big = backend.start(sized("big", 700))
    small = backend.start(sized("small", 200))
    assert (big.node, small.node) == ("n1", "n1")  # first fit
    w1, w2, w3 = backend.start(sized("w", 300)), backend.start(sized("w", 800)), backend.start(sized("w", 900))
    assert w1.node == "n2" and w2.pending.cause == "no-room" and w3.pending.cause == "no-room"
    assert backend.start(sized("huge", 2000)).pending.cause == "too-large"
    backend.stop(w3.replica_id)  # never placed: leaves, reported as asked
    assert backend.exits()[-1].expected
    backend.crash(big.replica_id)
    backend.exits()
    assert {r.replica_id: r.node for r in backend.list() if r.variant == "w"} == {
        w1.replica_id: "n2",
        w2.replica_id: "n1",
    }
