"""KVEventLog: a replica's feed of the block hashes its block cache stored and evicted. No torch.

The block cache (tandem.engine.kv_blocks) tells the log each block it registers (`stored`) and
each one it evicts (`removed`); each is one numbered event. A reader (the gateway's kv-aware
router, through GET /kv/events?since=SEQ: tandem.serve.kv_events) asks for what changed after the
last event it saw and gets `tandem.contracts.KVEvents`: the net change (a hash stored then removed
inside the window is reported removed, and the other way round), up to the newest event `seq`.

Bounded: the log keeps the last `capacity` events. A reader whose `since` is older than what is
kept, or is not an event of this log at all, gets `reset: true` with every hash held now, and
drops what it knew. Event numbers start at `first_seq` (the replica passes its start time in
microseconds), so a reader's `since` from before a restart is below every number of the new log:
a restart always reads as a reset, never as a quiet continuation.

Thread-safe: the engine's thread records, the server's event loop reads.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque

from tandem.contracts import KVEvents

__all__ = ["KVEventLog"]


class KVEventLog:
    def __init__(self, block_size: int, hash_seed: int = 0, capacity: int = 65536, first_seq: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"the KV event log must keep at least one event, got capacity {capacity}")
        self.block_size, self.hash_seed, self.capacity = block_size, hash_seed, capacity
        self._events: deque[tuple[int, bool]] = deque(maxlen=capacity)  # (hash, stored?) of events oldest..newest
        self._held: set[int] = set()
        self._seq = first_seq  # the newest event's number; events are first_seq + 1, first_seq + 2, ...
        self._lock = threading.Lock()

    @property
    def seq(self) -> int:
        with self._lock:
            return self._seq

    def stored(self, block_hash: int) -> None:
        self._record(block_hash, True)

    def removed(self, block_hash: int) -> None:
        self._record(block_hash, False)

    def _record(self, block_hash: int, stored: bool) -> None:
        with self._lock:
            self._events.append((block_hash, stored))
            self._seq += 1
            if stored:
                self._held.add(block_hash)
            else:
                self._held.discard(block_hash)

    def since(self, seq: int) -> KVEvents:
        """What changed after event `seq`; a reset with every held hash when the log cannot say."""
        with self._lock:
            oldest_kept = self._seq - len(self._events)  # events after this number are kept (>= first_seq)
            if seq > self._seq or seq < oldest_kept:
                return self._answer(True, tuple(self._held), ())
            net: dict[int, bool] = {}
            for block_hash, stored in itertools.islice(self._events, len(self._events) - (self._seq - seq), None):
                net[block_hash] = stored
            stored = tuple(h for h, s in net.items() if s)
            removed = tuple(h for h, s in net.items() if not s)
            return self._answer(False, stored, removed)

    def _answer(self, reset: bool, stored: tuple[int, ...], removed: tuple[int, ...]) -> KVEvents:
        return KVEvents(self._seq, self.block_size, self.hash_seed, reset, stored, removed)
