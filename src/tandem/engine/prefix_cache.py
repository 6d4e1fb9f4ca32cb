"""PrefixCache: automatic prefix caching over KV slots. No torch.

What is reused: the keys and values of identical prompt prefixes, in full blocks of `block_size`
tokens, found through hash chains as in vLLM's automatic prefix caching: block i's hash covers its
own tokens and the hash of block i - 1, so one hash names a whole prefix, and a hit on block i
implies blocks 0..i-1. A hit is checked token by token against what the slot holds, so a hash
collision can never serve another prompt's keys.

Where the cached blocks live: in the KV slots themselves, not in a separate block pool. tandem's
cache is one slot of max_model_len positions per running sequence, read in place by the varlen
decode-attention kernel (tandem.kernels), whose interface is (slot, start) per row; paged block
tables would need a new kernel. So:

- a running sequence's slot holds the blocks it has computed; they are pinned (referenced by their
  owner) and never change while it runs, because a sequence only appends;
- a finished sequence's slot keeps its blocks, unpinned: the cache is exactly the free slots' content,
  so it costs no memory beyond the KV budget and needs no budget of its own;
- a new request whose prompt starts with cached blocks either adopts the free slot that holds them
  (zero copy: the sequence continues from the cached prefix in place) or, when only running slots
  hold them, gets its prefix copied slot to slot (`StepPlan.copies`: a memcpy at memory bandwidth,
  against recomputing the prefill through every layer);
- eviction is by slot: a request with no hit (or one copying its prefix) takes the least recently
  used free slot that holds no block of its own that was ever reused (its system prompt is also in
  other slots, since sequences sharing a prompt each hold a copy; its tail and output were never
  asked for again), else the least recently used free slot; what the slot held past the reused
  prefix is dropped.

The prompt's last token is always recomputed (its logits sample the first output token), so a hit
covers at most len(prompt) - 1 tokens and may end inside a block: slots are addressed per token, so a
partial last block costs nothing extra. Counters follow vLLM: queries and hits in tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PrefixCache", "PrefixHit", "block_hashes", "hash_block"]


def hash_block(parent: int | None, tokens: Sequence[int]) -> int:
    """One link of the chain: the block's tokens and everything before them (via the parent's hash)."""
    return hash((parent, tuple(tokens)))


def block_hashes(ids: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    """Hash chain of the full blocks of ids; `parent` is the hash of the block before ids[0] (if any)."""
    hashes = []
    for lo in range(0, len(ids) - block_size + 1, block_size):
        parent = hash_block(parent, ids[lo : lo + block_size])
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class PrefixHit:
    slot: int  # where the new sequence runs
    num_tokens: int  # prompt tokens whose keys and values are already there (or copied there)
    copy_from: int | None  # the running slot the prefix is copied from; None when adopted in place or a miss


class _SlotBlocks:
    """The blocks one slot holds: their hashes, and the tokens they cover (to rule out collisions)."""

    __slots__ = ("hashes", "tokens")

    def __init__(self) -> None:
        self.hashes: list[int] = []
        self.tokens: list[int] = []


class PrefixCache:
    def __init__(self, num_slots: int, block_size: int = 16, enabled: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"prefix cache block size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enabled = enabled
        self._slots = [_SlotBlocks() for _ in range(num_slots)]
        self._where: dict[int, set[int]] = {}  # block hash -> slots holding that block (at its position)
        self._reused: set[int] = set()  # cached blocks that served a hit at least once
        # Free slots, least recently used first; never-used slots come first, lowest number first.
        self._free: OrderedDict[int, None] = OrderedDict((s, None) for s in range(num_slots))
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0
        self.num_evicted_blocks = 0  # cached blocks dropped because their slot was taken for other tokens

    # -- slots -----------------------------------------------------------------------------------

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks held across all slots, pinned (a running sequence's) or not (a free slot's)."""
        return sum(len(held.hashes) for held in self._slots)

    def ref_count(self, block_hash: int) -> int:
        """Running sequences whose slots hold this block: pinned copies. Copies in free slots have no
        reference and are what eviction takes, least recently used first."""
        return sum(1 for slot in self._where.get(block_hash, ()) if slot not in self._free)

    def admit(self, prompt: Sequence[int], use_cache: bool = True) -> PrefixHit:
        """Take a free slot for a new sequence with this prompt, reusing its longest cached prefix.

        use_cache=False (or caching disabled) still takes a free slot but reuses nothing: for a
        request that needs every prompt position computed (prompt logprobs)."""
        if not self._free:
            raise RuntimeError("no free KV slot")
        num_tokens, source = 0, None
        if self.enabled and use_cache:
            num_tokens, source = self._longest_hit(prompt)
            self.num_queried_tokens += len(prompt)
            self.num_hit_tokens += num_tokens
        if source is not None and source in self._free:
            slot, copy_from = source, None  # adopt the free slot that holds the prefix: nothing to copy
        elif self.enabled:
            slot, copy_from = self._victim(), source
        else:
            slot, copy_from = min(self._free), None  # the lowest slot keeps the torch path's ranges compact
        del self._free[slot]
        # Only blocks whose every position holds valid keys stay registered: a copy covers num_tokens,
        # and a later admission in the same step may copy from this slot before the forward runs.
        blocks = num_tokens // self.block_size
        if source is not None:
            self._reused.update(self._slots[source].hashes[:blocks])
        if copy_from is None:
            self._truncate(slot, blocks)
        else:
            self._truncate(slot, 0)
            src, held = self._slots[copy_from], self._slots[slot]
            held.hashes = src.hashes[:blocks]
            held.tokens = src.tokens[: blocks * self.block_size]
            for h in held.hashes:
                self._where.setdefault(h, set()).add(slot)
        return PrefixHit(slot, num_tokens, copy_from)

    def commit(self, slot: int, num_computed: int, prompt: Sequence[int], output: Sequence[int] = ()) -> None:
        """Record the full blocks among the first num_computed tokens of prompt + output (the slot's
        sequence): their keys and values are in the slot now."""
        held = self._slots[slot]
        have = len(held.tokens)
        if not self.enabled or have + self.block_size > num_computed:
            return
        upto = num_computed - num_computed % self.block_size
        cut = len(prompt)
        new_tokens = [*prompt[have:upto], *output[max(0, have - cut) : max(0, upto - cut)]]
        new = block_hashes(new_tokens, self.block_size, held.hashes[-1] if held.hashes else None)
        held.hashes += new
        held.tokens += new_tokens
        for h in new:
            self._where.setdefault(h, set()).add(slot)

    def release(self, slot: int) -> None:
        """The slot's sequence ended: its blocks stay cached; the slot is the most recently used."""
        self._free[slot] = None
        self._free.move_to_end(slot)

    # -- internals -------------------------------------------------------------------------------

    def _longest_hit(self, prompt: Sequence[int]) -> tuple[int, int | None]:
        """(prompt tokens reusable, a slot holding them), preferring a free slot (no copy). At most
        len(prompt) - 1 tokens: the last one is recomputed for its logits."""
        size, parent, where = 0, None, set()
        for lo in range(0, len(prompt) - self.block_size + 1, self.block_size):
            parent = hash_block(parent, prompt[lo : lo + self.block_size])
            slots = self._where.get(parent)
            if not slots:
                break
            size, where = lo + self.block_size, slots
        size = min(size, len(prompt) - 1)
        if size <= 0:
            return 0, None
        # A hash names a prefix; the tokens confirm it (a collision must not serve another prompt).
        prefix = list(prompt[:size])
        confirmed = [s for s in where if self._slots[s].tokens[:size] == prefix]
        if not confirmed:
            return 0, None
        free = [s for s in confirmed if s in self._free]
        return size, (free[0] if free else min(confirmed))

    def _victim(self) -> int:
        """The free slot to take over. First the least recently used one that holds no reused block
        of its own: its reused blocks (a system prompt) are also in other slots (sequences sharing a
        prompt each hold a copy), and the rest (a request's own tail, its output) were never asked for
        again. Otherwise the least recently used. Free slots are in LRU order."""
        for slot in self._free:
            if not any(len(self._where[h]) == 1 and h in self._reused for h in self._slots[slot].hashes):
                return slot
        return next(iter(self._free))

    def _truncate(self, slot: int, blocks: int) -> None:
        held = self._slots[slot]
        self.num_evicted_blocks += max(0, len(held.hashes) - blocks)
        for h in held.hashes[blocks:]:
            slots = self._where.get(h)
            if slots is not None:
                slots.discard(slot)
                if not slots:
                    del self._where[h]
                    self._reused.discard(h)
        del held.hashes[blocks:]
        del held.tokens[blocks * self.block_size :]
