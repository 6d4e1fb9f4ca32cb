"""Batcher: iteration-level continuous batching over a paged KV cache. No torch.

Each step, waiting requests are admitted in order of their `priority` (vLLM's: lower first; 0 by
default), then of arrival, while a sequence slot is free and the KV block pool can promise them the
blocks they may need (the head of the queue waits for room rather than be overtaken), prompts are
prefilled in chunks under a token budget, and every sequence past prefill decodes one token. One
fairness rule bends the order: the choices of one API request (a `group`: n choices, or a list of
prompts) are one request, and when several wait, they take the free slots in turns, the one holding
the fewest first (a request past `max_group_share` of the slots after all those under it); so a
request of many sequences cannot make a neighbour wait for all of them, only for the slots it
already holds to free (there is no preemption). When nobody else waits, one request takes every free
slot (no slot idles for fairness); without groups, arrival order. A finished or aborted sequence
gives its slot and its blocks back at once, so the next step can admit a waiting one.

KV memory is blocks (tandem.engine.kv_blocks.KVBlocks): admission gives a sequence the cached
blocks its prompt starts with (shared, reference-counted: its prefill skips them) and reserves the
rest; a sequence takes blocks as its tokens arrive, and its full blocks are registered in the
block cache as soon as their keys are computed, for the next prompt with that prefix. A slot is
only a sequence's index among the running ones (a draft model keeps its own cache per slot).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from tandem.engine.kv_blocks import KVBlocks, KVEventSink
from tandem.engine.sequence import Sequence, SequenceStatus

__all__ = ["Batcher", "StepPlan"]

# A Batcher made without a pool size (tests of its queue logic) gets one this large: bookkeeping
# only, never-used blocks cost nothing.
UNBOUNDED_BLOCKS = 1 << 40


@dataclass
class StepPlan:
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens this step)
    decode: list[Sequence] = field(default_factory=list)

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
        num_blocks: int | None = None,
        hash_seed: int = 0,
        events: KVEventSink | None = None,
    ) -> None:
        if num_slots < 1:
            raise ValueError("the engine must run at least one sequence at a time")
        if not 0.0 < max_group_share <= 1.0:
            raise ValueError(f"max_group_share must be in (0, 1], got {max_group_share!r}")
        self.num_slots = num_slots
        # Slots one group may hold while others wait (at least one).
        self.group_slots = max(1, math.floor(max_group_share * num_slots + 1e-9))
        self.max_prefill_tokens = max_prefill_tokens
        self.kv = KVBlocks(
            UNBOUNDED_BLOCKS if num_blocks is None else num_blocks, block_size, prefix_caching, hash_seed, events
        )
        self._free_slots = list(range(num_slots))  # kept sorted: the lowest free slot is taken first
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def add(self, seq: Sequence) -> None:
        """Queue `seq` behind every waiting sequence of its priority or a lower value (vLLM's: lower first)."""
        if not self.waiting or self.waiting[-1].priority <= seq.priority:
            self.waiting.append(seq)
            return
        at = next(i for i, s in enumerate(self.waiting) if s.priority > seq.priority)
        self.waiting.insert(at, seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        kv = self.kv
        for seq in self.running:  # blocks the last step completed become reusable
            kv.commit(seq)
        # Sequences already decoding before this step's admissions decode this step.
        plan.decode = [s for s in self.running if not s.in_prefill]
        admitted: set[int] = set()
        for seq in self._admitted(len(self._free_slots)):
            if not kv.admit(seq, use_cache=seq.params.prompt_logprobs is None):
                break  # the pool cannot promise its blocks yet: it (and those after it) wait for room
            seq.slot = self._free_slots.pop(0)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.add(id(seq))
        if admitted:
            self.waiting = deque(s for s in self.waiting if id(s) not in admitted)
        budget = self.max_prefill_tokens
        for seq in self.running:
            if budget <= 0:
                break
            if seq.in_prefill:
                chunk = min(len(seq.prompt_ids) - seq.num_computed, budget)
                plan.prefill.append((seq, chunk))
                kv.grow(seq, seq.num_computed + chunk)
                budget -= chunk
        for seq in plan.decode:
            kv.grow(seq, seq.num_computed + 1)  # the fed token's position (speculative rows grow more)
        return plan

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Blocks for seq's first num_tokens positions, before a step writes them (within its reservation)."""
        self.kv.grow(seq, num_tokens)

    def _admitted(self, free: int) -> list[Sequence]:
        """The waiting sequences to admit into `free` slots, in the order they take them (left on the
        queue: the caller removes those admitted). Requests take the slots in turns: each next slot
        goes to the waiting request holding the fewest (those under their share before those at it),
        ties to the one waiting longest; a sequence without a group is a request of its own. With no
        other request waiting, one takes every free slot."""
        if not free or not self.waiting:
            return []
        if len(self.waiting) <= free or self.group_slots >= self.num_slots:
            return [self.waiting[i] for i in range(min(free, len(self.waiting)))]
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
            # Its full blocks stay cached (unreferenced) until their room is needed.
            self.kv.release(seq)
            self._free_slots.append(seq.slot)
            self._free_slots.sort()
            seq.slot = None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
