"""KV blocks: the paged KV cache's bookkeeping, and the block cache that shares prefixes. No torch.

One pool of `num_blocks` blocks of `block_size` positions per replica (the model runner holds
their keys and values); every running sequence has a block table, the blocks its positions live in
(position p in table[p // block_size]). The pool is the KV budget, counted in blocks, so what is in
use is known exactly (`BlockPool.num_used_blocks`).

The block cache, as vLLM's automatic prefix caching: a full block is registered under the hash of
its tokens chained to its parent's (`tandem.contracts.kv_block_hash`, so a gateway computes the very
same hashes from a prompt: block i's hash names the whole prefix up to it). A new sequence whose
prompt starts with registered blocks takes them into its table, reference-counted: every sequence
with that prefix reads one copy, and skips its prefill. The prompt's last token is always computed
(its logits give the first output token), so a hit is the prompt's full blocks before the one that
holds its last token: whole blocks only, and a sequence never writes a block another one reads. A
hit is checked token by token against what the block holds, so a hash collision never serves
another prompt's keys.

A block whose last reference is released stays cached (if registered) until its room is needed:
blocks are taken never-used first, then free unregistered ones, then the least recently used
cached ones (a released sequence's tail before its head, as vLLM does), and each eviction is
reported. Registration and eviction go to an event sink (`KVEventSink`, the replica's feed of KV
events: tandem.engine.kv_event_log).

Admission reserves: a sequence is admitted only when the pool can give it every block it may grow
into (prompt + max_tokens, capped at its context), less the cached blocks it shares, on top of what
running sequences were promised; blocks are then taken as its tokens arrive. So a running sequence
never runs out of blocks and nothing is preempted; a sequence that finishes early returns its
promise at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Tokens
from typing import Protocol

from tandem.contracts import kv_block_hash
from tandem.engine.sequence import Sequence

__all__ = ["BlockPool", "KVBlocks", "KVEventSink"]


class KVEventSink(Protocol):
    def stored(self, block_hash: int) -> None: ...

    def removed(self, block_hash: int) -> None: ...


class BlockPool:
    """Blocks, their reference counts and the cache of full blocks by hash."""

    def __init__(self, num_blocks: int, block_size: int, events: KVEventSink | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"KV block size must be >= 1, got {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.events = events
        # Per block used so far (blocks [len(_ref), num_blocks) were never used): references, the
        # hash it is registered under, and the tokens it holds then.
        self._ref: list[int] = []
        self._hash: list[int | None] = []
        self._tokens: list[tuple[int, ...] | None] = []
        self._cached: dict[int, int] = {}  # block hash -> block
        self._plain: list[int] = []  # free blocks that hold nothing cached
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free cached blocks, least recently used first
        self.num_evicted_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no running sequence holds (cached ones included: they are taken when needed)."""
        return self.num_blocks - len(self._ref) + len(self._plain) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by running sequences (a shared block counts once)."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Registered blocks, held or free."""
        return len(self._cached)

    def cached_hashes(self) -> list[int]:
        return list(self._cached)

    def ref_count(self, block: int) -> int:
        return self._ref[block] if block < len(self._ref) else 0

    def block_of(self, block_hash: int) -> int | None:
        return self._cached.get(block_hash)

    def longest_hit(self, hashes: list[int], ids: Tokens[int]) -> list[int]:
        """The registered blocks holding ids' first blocks, whose hashes are `hashes`, up to the first miss."""
        size, hit = self.block_size, []
        for i, h in enumerate(hashes):
            block = self._cached.get(h)
            if block is None or self._tokens[block] != tuple(ids[i * size : (i + 1) * size]):
                break  # not held, or a collision: another prompt's keys
            hit.append(block)
        return hit

    def num_free_among(self, blocks: list[int]) -> int:
        return sum(1 for b in blocks if self._ref[b] == 0)

    def take(self, blocks: list[int]) -> None:
        """Reference cached blocks (a hit)."""
        for block in blocks:
            if self._ref[block] == 0:
                del self._evictable[block]
            self._ref[block] += 1

    def allocate(self) -> int:
        """A block for new keys: a never-used one, else a free one holding nothing cached, else the
        least recently used cached one (evicted). RuntimeError when every block is held."""
        if len(self._ref) < self.num_blocks:
            block = len(self._ref)
            self._ref.append(0)
            self._hash.append(None)
            self._tokens.append(None)
        elif self._plain:
            block = self._plain.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._evict(block)
        else:
            raise RuntimeError("no free KV block")
        self._ref[block] = 1
        return block

    def release(self, blocks: list[int]) -> None:
        """Drop one reference to each block. A cached block stays cached when its last goes; the
        table's tail is released first, so it is evicted before the head, which others may share."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                if self._hash[block] is None:
                    self._plain.append(block)
                else:
                    self._evictable[block] = None

    def register(self, block: int, block_hash: int, tokens: Tokens[int]) -> bool:
        """Cache a full block under its hash; False when another block already holds that prefix
        (two sequences computed it at once: the first stays the cached copy)."""
        if block_hash in self._cached or self._hash[block] is not None:
            return False
        self._cached[block_hash] = block
        self._hash[block], self._tokens[block] = block_hash, tuple(tokens)
        if self.events is not None:
            self.events.stored(block_hash)
        return True

    def _evict(self, block: int) -> None:
        block_hash = self._hash[block]
        del self._cached[block_hash]
        self._hash[block] = self._tokens[block] = None
        self.num_evicted_blocks += 1
        if self.events is not None:
            self.events.removed(block_hash)


class KVBlocks:
    """Sequences' block tables over one BlockPool: admission (with cache hits and a reservation),
    growth, registration of full blocks, release. Counters follow vLLM: queries and hits in tokens."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        caching: bool = True,
        hash_seed: int = 0,
        events: KVEventSink | None = None,
    ) -> None:
        self.pool = BlockPool(num_blocks, block_size, events if caching else None)
        self.block_size = block_size
        self.caching = caching
        self.hash_seed = hash_seed
        self.reserved = 0  # blocks promised to running sequences and not yet taken
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    @property
    def num_evicted_blocks(self) -> int:
        return self.pool.num_evicted_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_available_blocks(self) -> int:
        """Free blocks not promised to a running sequence: what admission can still give."""
        return self.pool.num_free_blocks - self.reserved

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def max_blocks(self, seq: Sequence) -> int:
        """Every block the sequence may write: its prompt and max_tokens outputs, within its context."""
        return self.blocks_for(min(len(seq.prompt_ids) + seq.params.max_tokens, seq.max_len))

    def admit(self, seq: Sequence, use_cache: bool = True) -> bool:
        """Give seq its cached prefix and its reservation; False (and no change) when the pool cannot
        promise every block it may need. use_cache=False (or caching off) reuses nothing: for a
        request that needs every prompt position computed (prompt logprobs)."""
        prompt, size = seq.prompt_ids, self.block_size
        hit: list[int] = []
        if self.caching and not seq.block_hashes:
            # The full blocks before the one holding the last token: what a hit can cover.
            seq.block_hashes = self._chain([], prompt, (len(prompt) - 1) // size)
        if self.caching and use_cache:
            hit = self.pool.longest_hit(seq.block_hashes, prompt)
        need = self.max_blocks(seq) - len(hit)
        if need + self.pool.num_free_among(hit) > self.num_available_blocks:
            return False
        if self.caching and use_cache:
            self.num_queried_tokens += len(prompt)
            self.num_hit_tokens += len(hit) * size
        self.pool.take(hit)
        seq.block_table = hit
        seq.num_registered_blocks = len(hit)
        seq.blocks_promised = need
        self.reserved += need
        seq.num_computed = seq.num_cached_tokens = len(hit) * size
        return True

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Blocks for the sequence's first num_tokens positions (from its reservation)."""
        missing = self.blocks_for(num_tokens) - len(seq.block_table)
        if missing > seq.blocks_promised:
            raise RuntimeError(f"sequence {seq.request_id!r} grew past the KV blocks it reserved")
        for _ in range(missing):
            seq.block_table.append(self.pool.allocate())
        seq.blocks_promised -= max(0, missing)
        self.reserved -= max(0, missing)

    def commit(self, seq: Sequence) -> None:
        """Register the sequence's full blocks whose every position holds computed keys."""
        full = min(seq.num_computed // self.block_size, len(seq.block_table))
        if not self.caching or full <= seq.num_registered_blocks:
            return
        ids = seq.prompt_ids if full * self.block_size <= len(seq.prompt_ids) else seq.all_ids
        seq.block_hashes = self._chain(seq.block_hashes, ids, full)
        size = self.block_size
        for i in range(seq.num_registered_blocks, full):
            self.pool.register(seq.block_table[i], seq.block_hashes[i], ids[i * size : (i + 1) * size])
        seq.num_registered_blocks = full

    def release(self, seq: Sequence) -> None:
        """The sequence ended: its full blocks stay cached, the rest of its blocks and its promise are free."""
        self.commit(seq)
        self.pool.release(seq.block_table)
        self.reserved -= seq.blocks_promised
        seq.block_table, seq.blocks_promised = [], 0

    def _chain(self, hashes: list[int], ids: Tokens[int], count: int) -> list[int]:
        """hashes extended to the hash chain of ids' first `count` full blocks."""
        hashes, size = list(hashes), self.block_size
        for i in range(len(hashes), count):
            hashes.append(kv_block_hash(hashes[-1] if hashes else None, ids[i * size : (i + 1) * size], self.hash_seed))
        return hashes
