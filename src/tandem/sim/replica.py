"""A simulated replica: continuous batching with the speeds a Profile measured. Discrete time steps.

Each step of `dt` seconds: waiting sequences join while slots are free (FCFS); prefill runs one
sequence at a time at the Profile's prefill rate; every decoding sequence gets an equal share of
`decode_capacity(n)` output tokens/s for n decoding sequences. A token produced slower than the
latency SLO counts as a slow token. Simplification: prefill and decode do not slow each other.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tandem.contracts import Profile

__all__ = ["SimReplica", "SimSequence"]


@dataclass
class SimSequence:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefill_left_s: float = 0.0
    produced: float = 0.0
    first_token_s: float | None = None
    finished_s: float | None = None
    slow_tokens: float = 0.0


class SimReplica:
    def __init__(self, replica_id: str, profile: Profile, tpot_slo_s: float) -> None:
        self.replica_id = replica_id
        self.profile = profile
        self.tpot_slo_s = tpot_slo_s
        self.waiting: deque[SimSequence] = deque()
        self.running: list[SimSequence] = []

    @property
    def busy(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, seq: SimSequence) -> None:
        prefill = self.profile.prefill_tokens_per_s
        seq.prefill_left_s = seq.prompt_tokens / prefill if prefill > 0 else 0.0
        self.waiting.append(seq)

    def step(self, now: float, dt: float) -> tuple[list[SimSequence], float]:
        """Advance by dt; returns (sequences that finished, output tokens produced)."""
        while self.waiting and len(self.running) < self.profile.max_slots:
            self.running.append(self.waiting.popleft())
        budget = dt
        for seq in self.running:  # prefill one after another (FCFS) within the step's time
            if seq.prefill_left_s > 0 and budget > 0:
                used = min(seq.prefill_left_s, budget)
                seq.prefill_left_s -= used
                budget -= used
        decoding = [s for s in self.running if s.prefill_left_s <= 0]
        produced_total = 0.0
        if decoding:
            per_seq = self.profile.decode_capacity(len(decoding)) / len(decoding)
            slow = per_seq < 1.0 / self.tpot_slo_s
            for seq in decoding:
                tokens = min(per_seq * dt, seq.output_tokens - seq.produced)
                if seq.first_token_s is None and tokens > 0:
                    seq.first_token_s = now + dt
                seq.produced += tokens
                produced_total += tokens
                if slow:
                    seq.slow_tokens += tokens
        finished = [s for s in self.running if s.produced >= s.output_tokens - 1e-9]
        for seq in finished:
            seq.finished_s = now + dt
            seq.first_token_s = seq.first_token_s if seq.first_token_s is not None else now + dt
        self.running = [s for s in self.running if s.finished_s is None]
        return finished, produced_total
