"""StepBatch: one engine step's work, from the Batcher's plan to the forward's rows and back."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.engine.sequence import Sequence
from tandem.engine.speculation import Proposal

__all__ = ["StepBatch"]


@dataclass
class StepBatch:
    """One step's work: the plan's sequences, the speculator's proposals and the forward's rows."""

    prefill: list[tuple[Sequence, int]]
    decode: list[Sequence]
    proposals: list[Proposal | None]  # per decode row
    rows: list[list[int]] = field(default_factory=list)  # prefill rows first, then decode rows
    tables: list[list[int]] = field(default_factory=list)  # each row's block table
    starts: list[int] = field(default_factory=list)
    scored: list[int] = field(default_factory=list)
    started: float = 0.0  # when the step began, on the engine's clock
    draft_seconds: float = 0.0  # the speculator's proposing, on the engine's clock
    verified: list[Sequence] = field(default_factory=list)  # rows whose proposals were verified, with
    drafted: list[int] = field(default_factory=list)  # how many tokens each was proposed
    accepted: list[int] = field(default_factory=list)  # and how many of those the target accepted

    def add_row(self, seq: Sequence, tokens: list[int], scored: int) -> None:
        self.rows.append(tokens)
        self.tables.append(seq.block_table)
        self.starts.append(seq.num_computed)
        self.scored.append(scored)

    @property
    def num_tokens(self) -> int:
        return sum(len(row) for row in self.rows)
