"""Packing replicas onto nodes: first-fit decreasing over memory (and accelerators). Pure.

A replica needs its Profile's weight bytes plus its KV budget (`Profile.memory_bytes`) and its
accelerators; a node offers memory and, optionally, a number of accelerators. First-fit
decreasing (largest replica first, each into the first node with room, else a new node) is exact
for replicas of one size (a fleet of one variant) and, over memory alone, never uses more than
11/9 OPT + 6/9 nodes (Dosa 2007), so no solver is needed. A narrower recipe (int8 halves the weights) fits
more replicas on a node, and the node count says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NodeShape", "PackItem", "first_fit_decreasing", "nodes_needed"]


@dataclass(frozen=True)
class NodeShape:
    memory_bytes: int
    accelerators: int = 0  # 0: accelerators are not a constraint (CPU nodes, or memory-only packing)

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0 or self.accelerators < 0:
            raise ValueError("a node needs memory_bytes > 0 and accelerators >= 0")


@dataclass(frozen=True)
class PackItem:
    name: str
    memory_bytes: int
    accelerators: int = 0

    def fits(self, node: NodeShape) -> bool:
        return self.memory_bytes <= node.memory_bytes and (
            not node.accelerators or self.accelerators <= node.accelerators
        )


def first_fit_decreasing(items: Sequence[PackItem], node: NodeShape) -> list[list[PackItem]]:
    """The nodes (each a list of items) first-fit decreasing opens for `items`."""
    for item in items:
        if not item.fits(node):
            raise ValueError(
                f"{item.name} needs {item.memory_bytes / 2**30:.2f} GiB and {item.accelerators} accelerator(s): "
                f"more than one node has ({node.memory_bytes / 2**30:.2f} GiB, {node.accelerators or 'any'})"
            )
    bins: list[list[PackItem]] = []
    room: list[list[int]] = []  # per bin: [memory left, accelerators left]
    for item in sorted(items, key=lambda i: (i.memory_bytes, i.accelerators), reverse=True):
        for index, (memory, accelerators) in enumerate(room):
            if item.memory_bytes <= memory and (not node.accelerators or item.accelerators <= accelerators):
                bins[index].append(item)
                room[index][0] -= item.memory_bytes
                room[index][1] -= item.accelerators
                break
        else:
            bins.append([item])
            room.append([node.memory_bytes - item.memory_bytes, node.accelerators - item.accelerators])
    return bins


def nodes_needed(items: Sequence[PackItem], node: NodeShape) -> int:
    return len(first_fit_decreasing(items, node))
