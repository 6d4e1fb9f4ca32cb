"""Batcher: iteration-level continuous batching over preallocated KV slots. No torch.

Each step, waiting requests are admitted in order of their `priority` (vLLM's: lower first; 0 by
default), then of arrival, while a slot is free (no preemption: a running sequence keeps its
slot); prompts are prefilled in chunks under a token budget, and every sequence past prefill
decodes one token. One fairness rule bends the order: the choices of one API request (a `group`:
n choices, or a list of prompts) are one request, and when several wait, they take the free slots
in turns, the one holding the fewest first (a request past `max_group_share` of the slots after all
those under it); so a request of many sequences cannot make a neighbour wait for all of them, only
for the slots it already holds to free (there is no preemption). When nobody else waits, one
request takes every free slot (no slot idles for fairness); without groups, arrival order. A
finished or aborted sequence gives its slot back at once, so the next step can admit a waiting one.

Admission goes through the PrefixCache (tandem.engine.prefix_cache): a prompt that starts with
blocks some slot already holds skips them, either continuing in that (free) slot or getting them
copied from a running one; the copies are part of the plan, for the engine to run before the forward.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.sequence import Sequence, SequenceStatus

__all__ = ["Batcher", "KVCopy", "StepPlan"]


@dataclass(frozen=True)
class KVCopy:
    """Copy the keys and values of positions [0, num_tokens) from one slot to another."""

    src_slot: int
    dst_slot: int
    num_tokens: int


@dataclass
class StepPlan:
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens this step)
    decode: list[Sequence] = field(default_factory=list)
    copies: list[KVCopy] = field(default_factory=list)  # cached prefixes to copy first, in this order

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Batcher:
    def __init__(
        self,
        num_slots: int,
        max_prefill_tokens: int,
        prefix_caching: bool = False,
        block_size: int = 16,
        max_group_share: float = 1.0,
    ) -> None:
        if num_slots < 1:
            raise ValueError("the KV budget must hold at least one sequence of max_model_len tokens")
        if not 0.0 < max_group_share <= 1.0:
            raise ValueError(f"max_group_share must be in (0, 1], got {max_group_share!r}")
        self.num_slots = num_slots
        # Slots one group may hold while others wait (at least one).
        self.group_slots = max(1, math.floor(max_group_share * num_slots + 1e-9))
        self.max_prefill_tokens = max_prefill_tokens
        self.prefix_cache = PrefixCache(num_slots, block_size, enabled=prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def num_free_slots(self) -> int:
        return self.prefix_cache.num_free_slots

    def add(self, seq: Sequence) -> None:
        """Queue `seq` behind every waiting sequence of its priority or a lower value (vLLM's: lower first)."""
        if not self.waiting or self.waiting[-1].priority <= seq.priority:
            self.waiting.append(seq)
            return
        at = next(i for i, s in enumerate(self.waiting) if s.priority > seq.priority)
        self.waiting.insert(at, seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        cache = self.prefix_cache
        for seq in self.running:  # blocks the last step completed become reusable
            cache.commit(seq.slot, seq.num_computed, seq.prompt_ids, seq.output_ids)
        # Sequences already decoding before this step's admissions decode this step.
        plan.decode = [s for s in self.running if not s.in_prefill]
        for seq in self._admitted(cache.num_free_slots):
            hit = cache.admit(seq.prompt_ids, use_cache=seq.params.prompt_logprobs is None)
            seq.slot, seq.num_computed, seq.num_cached_tokens = hit.slot, hit.num_tokens, hit.num_tokens
            if hit.copy_from is not None:
                plan.copies.append(KVCopy(hit.copy_from, hit.slot, hit.num_tokens))
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
        budget = self.max_prefill_tokens
        for seq in self.running:
            if budget <= 0:
                break
            if seq.in_prefill:
                chunk = min(len(seq.prompt_ids) - seq.num_computed, budget)
                plan.prefill.append((seq, chunk))
                budget -= chunk
        return plan

    def _admitted(self, free: int) -> list[Sequence]:
        """The waiting sequences to admit into `free` slots (taken off the queue). Requests take the slots
        in turns: each next slot goes to the waiting request holding the fewest (those under their share
        before those at it), ties to the one waiting longest; a sequence without a group is a request
        of its own. With no other request waiting, one takes every free slot."""
        if not free or not self.waiting:
            return []
        if len(self.waiting) <= free or self.group_slots >= self.num_slots:
            return [self.waiting.popleft() for _ in range(min(free, len(self.waiting)))]
        held = Counter(s.group for s in self.running if s.group is not None)
        queues: dict[object, deque[Sequence]] = {}  # in the order each request's first sequence waits
        for seq in self.waiting:
            queues.setdefault(seq.group if seq.group is not None else id(seq), deque()).append(seq)
        rank = {key: i for i, key in enumerate(queues)}
        chosen: list[Sequence] = []
        while len(chosen) < free and queues:
            key = min(queues, key=lambda k: (queues[k][0].priority, held[k] >= self.group_slots, held[k], rank[k]))
            chosen.append(queues[key].popleft())
            held[key] += 1
            if not queues[key]:
                del queues[key]
        taken = set(map(id, chosen))
        self.waiting = deque(s for s in self.waiting if id(s) not in taken)
        return chosen

    def release_finished(self) -> list[Sequence]:
        """Free the slots of finished sequences and drop them from the running set."""
        done = [s for s in self.running if s.finished]
        if done:
            self.running = [s for s in self.running if not s.finished]
            for seq in done:
                self._release(seq)
        return done

    def abort(self, request_id: str) -> Sequence | None:
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.finish("abort")
                return seq
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                seq.finish("abort")
                self._release(seq)
                return seq
        return None

    def _release(self, seq: Sequence) -> None:
        if seq.slot is not None:
            # What the slot holds stays cached (unpinned) until the slot is taken again.
            self.prefix_cache.commit(seq.slot, seq.num_computed, seq.prompt_ids, seq.output_ids)
            self.prefix_cache.release(seq.slot)
            seq.slot = None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
