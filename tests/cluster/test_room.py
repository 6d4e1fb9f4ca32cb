"""Room on nodes: first fit by memory, the pending reasons' words, the local budget."""

from __future__ import annotations

import pytest

from tandem.cluster.backend import PendingPlacement, Replica, ReplicaSpec, ReplicaState
from tandem.cluster.room import (
    GiB,
    MemoryLedger,
    MiB,
    NodeBudget,
    format_bytes,
    local_memory_budget,
    machine_memory_bytes,
    place,
    placing_order,
)


def test_format_bytes_says_mib_below_a_gib_and_gib_from_there():
    assert format_bytes(412 * MiB) == "412 MiB"
    assert format_bytes(0) == "0 MiB"
    assert format_bytes(3 * GiB // 2) == "1.50 GiB"


def test_first_fit_takes_the_first_node_with_room():
    nodes = [NodeBudget("a", GiB), NodeBudget("b", 2 * GiB)]
    assert place(512 * MiB, nodes, {}) == "a"
    assert place(512 * MiB, nodes, {"a": 600 * MiB}) == "b"
    assert place(GiB, nodes, {"a": 0}) == "a"  # exactly full is a fit
    assert place(0, nodes, {"a": 5 * GiB}) == "a"  # no memory figure: not counted


def test_no_room_names_the_bytes_and_the_node():
    got = place(412 * MiB, [NodeBudget("local", GiB)], {"local": GiB - 128 * MiB})
    assert got == PendingPlacement("no-room", "needs 412 MiB, free 128 MiB on node local")
    assert got.reason == "no room: needs 412 MiB, free 128 MiB on node local"
    two = place(GiB, [NodeBudget("a", 2 * GiB), NodeBudget("b", 2 * GiB)], {"a": 1800 * MiB, "b": 1500 * MiB})
    assert two.detail == "needs 1.00 GiB, free 548 MiB on node b (the most free on any of 2 nodes)"


def test_too_large_when_no_budget_could_ever_hold_it():
    got = place(5 * GiB, [NodeBudget("a", 3 * GiB), NodeBudget("b", 2 * GiB)], {})
    assert got.cause == "too-large"
    assert got.reason == "too large: needs 5.00 GiB, more than any node holds (the largest budget is 3.00 GiB, node a)"
    assert place(1, [], {}).cause == "too-large"
    with pytest.raises(ValueError):
        place(-1, [NodeBudget("a", 1)], {})


def test_waiting_replicas_are_placed_largest_first_then_oldest():
    def waiting(name: str, size: int, at: float) -> Replica:
        return Replica(
            name, ReplicaSpec(variant=name, recipe=None, memory_bytes=size), ReplicaState.STARTING, started_at=at
        )

    order = placing_order([waiting("s", MiB, 0), waiting("b2", GiB, 5), waiting("b1", GiB, 1)])
    assert [r.replica_id for r in order] == ["b1", "b2", "s"]


def test_the_ledger_holds_bytes_until_released():
    ledger = MemoryLedger([NodeBudget("local", GiB)])
    ledger.hold("r1", "local", 700 * MiB)
    assert ledger.decide(400 * MiB).cause == "no-room"
    (room,) = ledger.rooms()
    assert (room.used_bytes, room.free_bytes) == (700 * MiB, 324 * MiB)
    ledger.release("r1")
    assert ledger.decide(400 * MiB) == "local"


def test_the_local_budget_is_ram_less_ten_percent_or_a_gib():
    assert machine_memory_bytes("MemTotal:       24000000 kB\nMemFree: 1 kB\n") == 24000000 * 1024
    assert local_memory_budget(40 * GiB) == 36 * GiB
    assert local_memory_budget(4 * GiB) == 3 * GiB
    assert local_memory_budget(GiB // 2) == 0
    assert machine_memory_bytes() > 0
