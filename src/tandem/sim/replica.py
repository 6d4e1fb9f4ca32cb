"""A simulated replica: iteration-level continuous batching at the speeds a Profile measured.

It follows tandem's engine (and vLLM's chunked prefill): requests join in arrival order while a
slot (and, for a paged KV budget, its tokens) is free; each engine iteration runs every decoding
sequence one token plus a prefill chunk of up to `prefill_chunk_tokens` prompt tokens (first come,
first served), and takes

    n / decode_capacity(n)  +  chunk / prefill_tokens_per_s      (n = decoding sequences)

seconds, so a long prompt slows the decoding sequences beside it, as it does on real hardware. A
prompt's first output token comes out of the iteration that finishes its prefill.

Iterations are not stepped one by one (an hour of a fleet is millions of them): between two events
(an arrival, a prefill finishing, a sequence finishing, the end of the step) the batch does not
change, so every rate is constant and the next event's time is computed. Decoding sequences share
one counter of tokens per sequence, so advancing all of them is O(1); a heap orders their finishes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.contracts import Profile
from tandem.sim.prefix_cache import PrefixCache

__all__ = ["SimReplica", "SimSequence", "decode_iteration_times"]

_EPS = 1e-9


@dataclass(eq=False)
class SimSequence:
    arrival_s: float  # at the gateway
    prompt_tokens: int
    output_tokens: int
    submitted_s: float = 0.0  # reached a replica
    prefill_left: float = 0.0  # prompt tokens still to prefill
    first_token_s: float | None = None
    finished_s: float | None = None
    blocks: tuple[int, ...] = ()  # the prompt's prefix block ids (a trace's hash_ids)
    cached_tokens: int = 0  # prompt tokens the replica's block cache held when it was admitted
    tenant_class: str | None = None  # --tenant-mix's class (tandem.sim.tenant_mix)
    priority: int = 0  # higher first at the gateway's buffer

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def ttft_s(self) -> float:
        return (self.first_token_s if self.first_token_s is not None else math.inf) - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for a one-token answer)."""
        if self.finished_s is None or self.first_token_s is None:
            return math.inf
        return (self.finished_s - self.first_token_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


def decode_iteration_times(profile: Profile) -> tuple[float, ...]:
    """Seconds per engine iteration at n decoding sequences, n = 0 .. max_slots (without prefill)."""
    if profile.max_slots < 1 or not profile.decode_tokens_per_s or min(profile.decode_tokens_per_s.values()) <= 0:
        raise ValueError(f"the Profile of {profile.recipe!r} needs max_slots >= 1 and positive decode rates")
    return (0.0, *(n / profile.decode_capacity(n) for n in range(1, profile.max_slots + 1)))


class SimReplica:
    def __init__(
        self,
        replica_id: str,
        profile: Profile,
        prefill_chunk_tokens: int = 512,
        block_tokens: int = 0,
        iteration_s: Sequence[float] | None = None,
    ) -> None:
        """`block_tokens` > 0: a prefix block cache of blocks this long (tandem.sim.prefix_cache). `iteration_s`:
        `decode_iteration_times(profile)`, when the caller starts many replicas of one Profile (default: computed)."""
        self.decode_iteration_s = decode_iteration_times(profile) if iteration_s is None else iteration_s
        self.replica_id = replica_id
        self.profile = profile
        self.chunk = prefill_chunk_tokens
        self.prefill_rate = profile.prefill_tokens_per_s if profile.prefill_tokens_per_s > 0 else math.inf
        self.kv_budget = profile.kv_cache_tokens  # 0: slots only (tandem's engine reserves a slot of max_model_len)
        self.waiting: deque[SimSequence] = deque()  # submitted, no slot yet (FCFS)
        self.prefilling: deque[SimSequence] = deque()  # admitted, prompt not done
        self.decoding: list[tuple[float, int, SimSequence]] = []  # heap of (counter value when done, seq no, seq)
        self.counter = 0.0  # tokens each decoding sequence has produced since the replica started
        self.kv_used = 0
        self._seq_no = 0
        self._waiting_prompt = 0  # sum of the waiting prompts' tokens (what prefill_pending adds to the prefilling)
        self._prefilling_uncached = 0  # sum of prompt_tokens - cached_tokens over `prefilling` (the chunk's bound)
        self.version = 0  # bumped by every change of the queues or of a prefill's progress (what a load reports)
        self.prefix = PrefixCache(profile.kv_budget_tokens, block_tokens) if block_tokens > 0 else None

    @property
    def running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def busy(self) -> int:
        return self.running + len(self.waiting)

    @property
    def prefill_pending(self) -> int:
        """Prompt tokens submitted here and not yet prefilled (what AdmissionCap's token budget counts)."""
        return math.ceil(self._waiting_prompt + sum(s.prefill_left for s in self.prefilling))

    def in_flight(self) -> list[SimSequence]:
        return [*self.waiting, *self.prefilling, *(entry[2] for entry in self.decoding)]

    def submit(self, seq: SimSequence, now: float) -> None:
        seq.submitted_s = max(seq.arrival_s, now)
        seq.prefill_left = float(seq.prompt_tokens)
        self.waiting.append(seq)
        self._waiting_prompt += seq.prompt_tokens
        self.version += 1

    def _admit(self, t: float) -> None:
        while self.waiting and self.waiting[0].submitted_s <= t + _EPS and self.running < self.profile.max_slots:
            seq = self.waiting[0]
            if self.kv_budget and self.kv_used + seq.kv_tokens > self.kv_budget and self.running:
                return  # FCFS: wait for memory rather than let a later, shorter request overtake
            self.kv_used += seq.kv_tokens
            if self.prefix is not None:
                self.prefix.admit(seq)  # prefill only what its cache does not hold
            self.prefilling.append(self.waiting.popleft())
            self._waiting_prompt -= seq.prompt_tokens
            self._prefilling_uncached += seq.prompt_tokens - seq.cached_tokens
            self.version += 1

    def _finish(self, seq: SimSequence, t: float, done: list[SimSequence]) -> None:
        seq.finished_s = t
        self.kv_used -= seq.kv_tokens
        self.version += 1
        if self.prefix is not None:
            self.prefix.finished(seq)
        done.append(seq)

    def step(self, now: float, dt: float) -> list[SimSequence]:
        """Advance from `now` to `now + dt`; returns the sequences that finished.

        The hot loop of every simulation (one pass per event): the attributes it reads are held in locals."""
        done: list[SimSequence] = []
        t, end = now, now + dt
        waiting, prefilling, decoding = self.waiting, self.prefilling, self.decoding
        slots, chunk_max, prefill_rate, decode_iteration_s = (
            self.profile.max_slots, self.chunk, self.prefill_rate, self.decode_iteration_s
        )  # fmt: skip
        while t < end - _EPS:
            if waiting and waiting[0].submitted_s <= t + _EPS and len(prefilling) + len(decoding) < slots:
                self._admit(t)
            n = len(decoding)
            if n == 0 and not prefilling:
                nxt = waiting[0].submitted_s if waiting else end
                t = min(max(nxt, t), end)  # idle until the next request reaches this replica
                continue
            # The iteration's prompt tokens: a full chunk, or less when the prompts waiting are shorter (their
            # whole length, not what is left of them: where a step boundary falls must not change the speed).
            chunk = min(chunk_max, self._prefilling_uncached) if prefilling else 0.0
            iteration = decode_iteration_s[n] + chunk / prefill_rate
            prefill_speed = chunk / iteration if iteration > 0 else math.inf  # prompt tokens/s
            nxt = end  # the next event: the earliest of the step's end, the head's prefill done, a row done, a submit
            if prefilling:
                left = prefilling[0].prefill_left
                prefill_done = t + left / prefill_speed if prefill_speed > 0 else (t if left <= 0 else end)
                if prefill_done < nxt:
                    nxt = prefill_done
            if n:
                row_done = t + (decoding[0][0] - self.counter) * iteration
                if row_done < nxt:
                    nxt = row_done
            if waiting and waiting[0].submitted_s > t and len(prefilling) + n < slots:
                if waiting[0].submitted_s < nxt:
                    nxt = waiting[0].submitted_s
            if t > nxt:
                nxt = t
            elapsed = nxt - t
            if n:
                self.counter += elapsed / iteration
            if prefilling:
                head = prefilling[0]
                head.prefill_left -= elapsed * prefill_speed if elapsed > 0 else 0.0
                self.version += 1
                if nxt == prefill_done or head.prefill_left <= 1e-6:
                    prefilling.popleft()
                    self._prefilling_uncached -= head.prompt_tokens - head.cached_tokens
                    head.prefill_left = 0.0
                    head.first_token_s = nxt
                    if self.prefix is not None:
                        self.prefix.prefilled(head)
                    if head.output_tokens <= 1:
                        self._finish(head, nxt, done)
                    else:
                        self._seq_no += 1
                        heapq.heappush(decoding, (self.counter + head.output_tokens - 1, self._seq_no, head))
            if decoding:
                limit = self.counter + 1e-6
                while decoding and decoding[0][0] <= limit:
                    self._finish(heapq.heappop(decoding)[2], nxt, done)
            t = nxt
        return done
