"""A simulated replica's prefix block cache: block ids (a trace's `hash_ids`, one per full block of
the prompt, chained so equal ids mean an equal prefix), least recently used first out.

A prompt reuses the leading run of its blocks that the cache holds (`leading`: a block is only
reusable when every block before it is); tandem.sim.prefix_cache decides what is used and how much
room the cache has.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockCache"]


class BlockCache:
    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = max(0, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def leading(self, blocks: Sequence[int]) -> int:
        """How many of `blocks`, from the first, the cache holds (without touching them)."""
        run = 0
        for block in blocks:
            if block not in self._blocks:
                break
            run += 1
        return run

    def use(self, blocks: Sequence[int]) -> None:
        """A prompt's blocks were used (its prefill finished): kept, most recently used; room made."""
        for block in blocks:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        self._evict()

    def resize(self, capacity_blocks: int) -> None:
        self.capacity = max(0, capacity_blocks)
        self._evict()

    def _evict(self) -> None:
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
            self.evicted += 1
