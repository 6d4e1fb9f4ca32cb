"""Batcher: iteration-level continuous batching over preallocated KV slots. No torch.

Each step, waiting requests are admitted in arrival order while a slot is free (first come, first
served: a request never overtakes an earlier one), prompts are prefilled in chunks under a token
budget, and every sequence past prefill decodes one token. A finished or aborted sequence gives its
slot back at once, so the next step can admit a waiting request.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from tandem.engine.sequence import Sequence, SequenceStatus

__all__ = ["Batcher", "StepPlan"]


@dataclass
class StepPlan:
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens this step)
    decode: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Batcher:
    def __init__(self, num_slots: int, max_prefill_tokens: int) -> None:
        if num_slots < 1:
            raise ValueError("the KV budget must hold at least one sequence of max_model_len tokens")
        self.num_slots = num_slots
        self.max_prefill_tokens = max_prefill_tokens
        self._free = list(range(num_slots))  # a heap: the lowest slot first keeps the batch compact
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        # Sequences already decoding before this step's admissions decode this step.
        plan.decode = [s for s in self.running if not s.in_prefill]
        while self.waiting and self._free:
            seq = self.waiting.popleft()
            seq.slot = heapq.heappop(self._free)
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
            heapq.heappush(self._free, seq.slot)
            seq.slot = None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)
