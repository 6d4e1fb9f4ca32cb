"""ModelRunner: tensors in, logits out, over the KV cache. It knows no queues and no requests."""

from __future__ import annotations

import torch

from tandem.model.attention_batch import AttentionBatch
from tandem.model.packed_linear import pack_linears
from tandem.model.transformer import KVCache, Transformer

__all__ = ["ModelRunner"]


class ModelRunner:
    def __init__(self, module: Transformer, num_slots: int, max_len: int) -> None:
        self.module = module
        pack_linears(module)  # weights into oneDNN's layout once: decode reads them at full bandwidth
        self.cache = KVCache(module.config, num_slots, max_len, module.dtype)
        self.sliding_window = module.config.sliding_window

    @torch.inference_mode()
    def forward(self, tokens: list[list[int]], slots: list[int], starts: list[int], last_only: bool) -> torch.Tensor:
        """Run rows of equally many new tokens at their positions; return float32 logits.

        tokens[i] are the new tokens of the sequence in slot slots[i], which already holds
        starts[i] tokens. Returns [B, V] (last position) if last_only, else [B, T, V].
        """
        batch = AttentionBatch.build(slots, starts, len(tokens[0]), self.sliding_window)
        hidden = self.module(torch.tensor(tokens, dtype=torch.long), self.cache, batch)
        if last_only:
            hidden = hidden[:, -1]
        return self.module.logits(hidden)
