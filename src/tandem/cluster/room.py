"""Room on nodes: which node's memory budget takes a replica, or why none does. Pure, but `machine_memory_bytes`.

Every backend that places replicas by memory uses these words and this rule, so a local gateway, the
fake the tests and the simulator use, and a Ray cluster say the same thing about the same fleet:

- a node has a budget (`NodeBudget`): `nodes.memory` / `--node-memory-gb` for the local backend
  (default: this machine's RAM less a margin, `local_memory_budget`), a Ray node's `memory` resource;
- `place(need, nodes, placed)` is first fit: the first node (in the order given) whose budget less
  what is placed on it holds `need` bytes. None does: `PendingPlacement("too-large", ...)` when the
  largest budget is smaller than the need (it can never be placed until the nodes change), else
  `PendingPlacement("no-room", "needs 412 MiB, free 128 MiB on node local")` (free: the most any
  one node has now). A need of 0 (a replica without a memory figure) always takes the first node.
- Replicas waiting for room are placed largest first as room frees (`placing_order`): first-fit
  decreasing, as `tandem.schedule.packing` counts nodes for the simulator.

The scheduling layer re-exports these (tandem.schedule.memory) beside its own memory decisions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tandem.cluster.backend import PendingPlacement, Replica

__all__ = [
    "LOCAL_NODE",
    "MARGIN_BYTES",
    "MARGIN_SHARE",
    "MemoryLedger",
    "NodeBudget",
    "NodeRoom",
    "format_bytes",
    "local_memory_budget",
    "machine_memory_bytes",
    "place",
    "placing_order",
]

MiB = 1 << 20
GiB = 1 << 30
LOCAL_NODE = "local"  # the one node of the local backend: this machine
# What the local budget leaves to the gateway, the OS and the page cache: 10% of RAM, at least 1 GiB.
MARGIN_SHARE = 0.10
MARGIN_BYTES = GiB


def format_bytes(size: int) -> str:
    """412 MiB below a GiB, 1.50 GiB from there (what pending reasons and logs say)."""
    if abs(size) < GiB:
        return f"{round(size / MiB)} MiB"
    return f"{size / GiB:.2f} GiB"


@dataclass(frozen=True)
class NodeBudget:
    """One node's memory for replicas."""

    name: str
    memory_bytes: int

    def __post_init__(self) -> None:
        if not self.name or self.memory_bytes < 0:
            raise ValueError("a node budget needs a name and memory_bytes >= 0")


def place(need: int, nodes: Sequence[NodeBudget], placed: Mapping[str, int]) -> str | PendingPlacement:
    """The first node with `need` bytes free (`placed`: bytes held on each node by name), or why none has.

    A need of 0 takes the first node whatever it holds; no nodes at all is `too-large`."""
    if need < 0:
        raise ValueError("a memory need must be >= 0")
    if not nodes:
        return PendingPlacement("too-large", f"needs {format_bytes(need)}; there is no node to place it on")
    free = {node.name: node.memory_bytes - placed.get(node.name, 0) for node in nodes}
    for node in nodes:
        if need == 0 or need <= free[node.name]:
            return node.name
    largest = max(nodes, key=lambda n: n.memory_bytes)
    if need > largest.memory_bytes:
        return PendingPlacement(
            "too-large",
            f"needs {format_bytes(need)}, more than any node holds (the largest budget is "
            f"{format_bytes(largest.memory_bytes)}, node {largest.name})",
        )
    roomiest = max(nodes, key=lambda n: free[n.name])  # the first of them on ties
    others = f" (the most free on any of {len(nodes)} nodes)" if len(nodes) > 1 else ""
    return PendingPlacement(
        "no-room",
        f"needs {format_bytes(need)}, free {format_bytes(max(0, free[roomiest.name]))} on node {roomiest.name}{others}",
    )


def placing_order(waiting: Iterable[Replica]) -> list[Replica]:
    """Replicas waiting for room, in the order to try them: largest need first, then the longest waiting."""
    return sorted(waiting, key=lambda r: (-r.spec.memory_bytes, r.started_at, r.replica_id))


def machine_memory_bytes(meminfo: str | None = None) -> int:
    """This machine's RAM: MemTotal of /proc/meminfo (`meminfo`: its text, for tests), else the page count."""
    if meminfo is None:
        try:
            with open("/proc/meminfo") as file:
                meminfo = file.read()
        except OSError:
            meminfo = ""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            return int(parts[1]) * 1024  # kB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def local_memory_budget(total_bytes: int | None = None) -> int:
    """The local backend's default budget for replicas: RAM less 10% of it or 1 GiB, whichever is more."""
    total = machine_memory_bytes() if total_bytes is None else total_bytes
    return max(0, total - max(MARGIN_BYTES, int(total * MARGIN_SHARE)))


@dataclass(frozen=True)
class NodeRoom:
    """A node's budget and what replicas hold of it now (what a backend's `room()` reports)."""

    name: str
    memory_bytes: int
    used_bytes: int

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.used_bytes


class MemoryLedger:
    """Which replica holds how many bytes on which node, beside fixed node budgets. Not locked: its
    backend calls it under its own lock. A replica holds its bytes from placement until its process
    has exited (a stopping replica still holds them)."""

    def __init__(self, nodes: Sequence[NodeBudget]) -> None:
        if not nodes:
            raise ValueError("a memory ledger needs at least one node")
        self.nodes = tuple(nodes)
        self._held: dict[str, tuple[str, int]] = {}  # replica id -> (node, bytes)

    def used(self) -> dict[str, int]:
        used = {node.name: 0 for node in self.nodes}
        for node, size in self._held.values():
            used[node] = used.get(node, 0) + size
        return used

    def decide(self, need: int) -> str | PendingPlacement:
        return place(need, self.nodes, self.used())

    def hold(self, replica_id: str, node: str, size: int) -> None:
        self._held[replica_id] = (node, size)

    def release(self, replica_id: str) -> None:
        self._held.pop(replica_id, None)

    def node_of(self, replica_id: str) -> str | None:
        held = self._held.get(replica_id)
        return held[0] if held is not None else None

    def rooms(self) -> list[NodeRoom]:
        used = self.used()
        return [NodeRoom(n.name, n.memory_bytes, used.get(n.name, 0)) for n in self.nodes]
