"""AttentionBatch: where each row of a forward pass reads and writes its keys and values.

Built once per forward (not per layer) from plain lists, so the engine's queue logic stays free of
tensors. Each row is one sequence in its own KV slot; all rows carry the same number of new tokens
(1 for decode, k+1 for speculative verification, a chunk for prefill).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AttentionBatch"]


@dataclass(frozen=True)
class AttentionBatch:
    slots: torch.Tensor  # [B] long: KV slot of each row
    positions: torch.Tensor  # [B, T] long: absolute position of each new token
    slot_lo: int  # attention reads the contiguous slot range [slot_lo, slot_hi)
    slot_hi: int
    key_len: int  # keys 0..key_len-1 are read (max position + 1)
    rows: torch.Tensor | None  # [B] long: row index of each sequence inside the slot range; None = identity
    mask: torch.Tensor | None  # [R, 1, T, key_len] bool, True = attend; None = plain causal from 0
    fresh_causal: bool  # a single prompt starting at position 0: attend over the new keys alone

    @staticmethod
    def build(slots: list[int], starts: list[int], num_new: int, sliding_window: int | None = None) -> AttentionBatch:
        """slots[i]: KV slot of row i; starts[i]: how many tokens row i already has in its slot."""
        batch = len(slots)
        positions = torch.tensor(starts, dtype=torch.long)[:, None] + torch.arange(num_new)[None, :]
        key_len = max(starts) + num_new
        fresh = batch == 1 and starts[0] == 0 and (sliding_window is None or num_new <= sliding_window)
        lo, hi = min(slots), max(slots) + 1
        slot_t = torch.tensor(slots, dtype=torch.long)
        identity = hi - lo == batch and slots == list(range(lo, hi))
        rows = None if identity else slot_t - lo
        mask = None
        if not fresh:
            span = hi - lo
            keys = torch.arange(key_len)
            # Rows of idle slots inside the range attend to key 0 only: finite garbage, never read.
            mask = torch.zeros(span, 1, num_new, key_len, dtype=torch.bool)
            mask[:, :, :, 0] = True
            allowed = keys[None, None, :] <= positions[:, :, None]  # [B, T, K]
            if sliding_window is not None:
                allowed &= keys[None, None, :] > positions[:, :, None] - sliding_window
            mask[slot_t - lo, 0] = allowed
        return AttentionBatch(slot_t, positions, lo, hi, key_len, rows, mask, fresh)
