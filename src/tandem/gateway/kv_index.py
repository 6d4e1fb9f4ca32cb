"""The gateway's KV index: which replica holds which prefix blocks, as the replicas' KV events say.

Each replica publishes the hashes of the full KV blocks it stored and evicted
(`tandem.contracts.KVEvents`, GET /kv/events?since=SEQ: tandem.gateway.kv_feed polls it). The index
keeps, per replica, its block size, its hash seed, the newest event number read and the set of
block hashes it holds. `match` turns a tokenized prompt into the frozen `PrefixMatch` the
`kv-aware` router reads: per replica, how many of the prompt's leading tokens it holds (the
leading run of the prompt's hash chain found in its set: a block is only reusable when every block
before it is too).

Consistency: events apply in order. An answer with `reset` replaces what was known. An answer that
cannot follow what is known (its sequence number went back, or the block size or seed changed: the
replica restarted under the same address) drops the replica's entries and asks for a resync
(`apply` returns False; the feed then asks again from 0). A replica that exits, or restarts (a
new replica id), is forgotten (`forget`).

Between two polls the index would not know what the requests it just routed will leave behind, so
a conversation's next turn, sent the moment the last one ends, would miss its own history. So the
replica a request is routed to is *expected* to hold the request's blocks (`expect`, as SGLang's
router and Dynamo's do) until `expect_ttl_s` passes or its events confirm or remove them.
Pure data: no I/O; the time comes in as an argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tandem.contracts import KVEvents, kv_block_hashes
from tandem.schedule.routers import PrefixMatch

__all__ = ["KVIndex"]


@dataclass
class _Held:
    block_size: int
    hash_seed: int
    seq: int
    blocks: set[int] = field(default_factory=set)


class KVIndex:
    def __init__(self, expect_ttl_s: float = 10.0) -> None:
        self._held: dict[str, _Held] = {}
        self._expected: dict[str, dict[int, float]] = {}  # replica -> block hash -> until when
        self.expect_ttl_s = expect_ttl_s
        self.resyncs = 0  # answers that could not follow what was known (a gap, a restart): counted

    def since(self, replica_id: str) -> int:
        """The event number to ask `replica_id` for events after (0: everything, it is not known)."""
        held = self._held.get(replica_id)
        return held.seq if held is not None else 0

    def apply(self, replica_id: str, events: KVEvents, since: int) -> bool:
        """Record `replica_id`'s answer to ?since=`since`. False: it did not follow (the entries are
        dropped; ask again from 0)."""
        if events.block_size < 1:
            self.forget([replica_id])
            return False
        held = self._held.get(replica_id)
        if events.reset:
            self._held[replica_id] = _Held(events.block_size, events.hash_seed, events.seq, set(events.stored))
            self._held[replica_id].blocks.difference_update(events.removed)
            return True
        if held is None:
            if since != 0:  # asked from where an earlier life left off: cannot follow
                self.resyncs += 1
                return False
            held = self._held[replica_id] = _Held(events.block_size, events.hash_seed, 0)
        if (
            since != held.seq
            or events.seq < held.seq
            or (events.block_size, events.hash_seed) != (held.block_size, held.hash_seed)
        ):
            self.forget([replica_id])
            self.resyncs += 1
            return False
        held.blocks.update(events.stored)
        held.blocks.difference_update(events.removed)  # stored and evicted between two polls: gone
        held.seq = events.seq
        expected = self._expected.get(replica_id)
        if expected:
            for block in (*events.stored, *events.removed):
                expected.pop(block, None)
        return True

    def expect(self, replica_id: str, prompt_ids: Sequence[int], now: float) -> None:
        """`replica_id` was sent a request with this prompt: expect its blocks there for a while."""
        held = self._held.get(replica_id)
        if held is None:
            return
        expected = self._expected.setdefault(replica_id, {})
        for stale in [b for b, until in expected.items() if until <= now]:
            del expected[stale]
        until = now + self.expect_ttl_s
        for block in kv_block_hashes(prompt_ids, held.block_size, held.hash_seed):
            if block not in held.blocks:
                expected[block] = until

    def forget(self, replica_ids: Iterable[str]) -> None:
        for replica_id in replica_ids:
            self._held.pop(replica_id, None)
            self._expected.pop(replica_id, None)

    def keep_only(self, replica_ids: Iterable[str]) -> None:
        """Forget every replica not in `replica_ids` (those that exited, failed or restarted)."""
        keep = set(replica_ids)
        self.forget([r for r in self._held if r not in keep])

    def publishing(self) -> list[str]:
        return list(self._held)

    def blocks(self, replica_id: str) -> int:
        """How many blocks `replica_id` holds (0: none, or it publishes nothing)."""
        held = self._held.get(replica_id)
        return len(held.blocks) if held is not None else 0

    def scheme(self, replica_id: str) -> tuple[int, int] | None:
        """(block size, hash seed) of `replica_id`, None when it publishes nothing."""
        held = self._held.get(replica_id)
        return (held.block_size, held.hash_seed) if held is not None else None

    def match(
        self, prompt_ids: Sequence[int], replica_ids: Iterable[str] | None = None, now: float | None = None
    ) -> PrefixMatch:
        """Per replica (default: every one that publishes), the leading prompt tokens it holds (with
        `now`: or is expected to hold). The prompt is hashed once per (block size, seed) among them."""
        ids = list(self._held) if replica_ids is None else [r for r in replica_ids if r in self._held]
        chains: dict[tuple[int, int], list[int]] = {}
        cached: dict[str, int] = {}
        for replica_id in ids:
            held = self._held[replica_id]
            expected = self._expected.get(replica_id, {}) if now is not None else {}
            key = (held.block_size, held.hash_seed)
            if key not in chains:
                chains[key] = kv_block_hashes(prompt_ids, held.block_size, held.hash_seed)
            run = 0
            for block in chains[key]:
                if block not in held.blocks and not (now is not None and expected.get(block, -math.inf) > now):
                    break
                run += 1
            cached[replica_id] = run * held.block_size
        return PrefixMatch(len(prompt_ids), cached, frozenset(ids))
