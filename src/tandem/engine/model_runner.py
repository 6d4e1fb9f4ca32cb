"""ModelRunner: tensors in, logits out, over a paged KV cache. It knows no queues and no requests."""

from __future__ import annotations

import itertools

import torch

from tandem.kernels import kernels_available
from tandem.model.forward_batch import ForwardBatch
from tandem.model.packed_linear import pack_linears
from tandem.model.transformer import KVCache, Transformer

__all__ = ["ModelRunner", "joined_rows"]


def joined_rows(pieces: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(pieces) of 2-D row blocks, without the copy where they are consecutive rows of one
    tensor (forward_scored's logits split per sequence, taken back in order: 4 MB a step at batch 32
    with a 32k vocabulary). The result then shares their memory; nothing here writes to it."""
    first, last = pieces[0], pieces[-1]
    width, size, storage = first.shape[-1], first.element_size(), first.untyped_storage().data_ptr()
    consecutive = all(
        p.dim() == 2 and p.shape[1] == width and p.dtype == first.dtype and p.is_contiguous() for p in pieces
    ) and all(
        b.untyped_storage().data_ptr() == storage and b.data_ptr() == a.data_ptr() + a.numel() * size
        for a, b in itertools.pairwise(pieces)
    )
    if not consecutive:
        return torch.cat(pieces)
    rows = (last.data_ptr() - first.data_ptr()) // (width * size) + last.shape[0]
    return first.as_strided((rows, width), (width, 1))


class ModelRunner:
    def __init__(
        self,
        module: Transformer,
        num_blocks: int,
        block_size: int,
        max_len: int,
        kv_dtype: torch.dtype | None = None,
        kernels: bool | None = None,
    ) -> None:
        """A pool of num_blocks KV blocks of block_size positions each, for sequences of up to
        max_len tokens; which blocks a sequence's positions live in is its block table (the
        Batcher's, tandem.engine.kv_blocks), passed with every row."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"the KV pool needs at least one block of one position, got {num_blocks} x {block_size}")
        self.module = module
        self.block_size = block_size
        self.max_len = max_len
        module.ensure_positions(max_len)  # the loader built rotary tables for its default context only
        pack_linears(module)  # weights into oneDNN's layout once: decode reads them at full bandwidth
        self.cache = KVCache(module.config, num_blocks, block_size, kv_dtype or module.dtype)
        self.sliding_window = module.config.sliding_window
        self.heads_per_kv = module.config.num_attention_heads // module.config.num_key_value_heads
        # The C kernels (kernels=None: whenever they load; False: torch only): decode and verification
        # rows read only their own keys, in one call, and float32 layers fuse their small ops.
        readable = self.cache.k[0].dtype in (torch.float32, torch.bfloat16) and module.config.head_dim <= 256
        self.kernels = readable and kernels_available() if kernels is None else kernels and readable
        self._blocks_per_slot = 0

    @classmethod
    def with_slots(
        cls,
        module: Transformer,
        num_slots: int,
        max_len: int,
        kv_dtype: torch.dtype | None = None,
        kernels: bool | None = None,
        block_size: int = 16,
    ) -> ModelRunner:
        """A runner whose pool is num_slots fixed runs of blocks, one per sequence slot, each holding
        max_len positions (`slot_table(slot)`): for a cache that needs no sharing (a draft model's)."""
        per_slot = -(-max_len // block_size)
        runner = cls(module, num_slots * per_slot, block_size, max_len, kv_dtype, kernels)
        runner._blocks_per_slot = per_slot
        return runner

    def slot_table(self, slot: int) -> list[int]:
        """The block table of a slot of a `with_slots` runner."""
        if not self._blocks_per_slot:
            raise ValueError("slot_table needs a runner made by ModelRunner.with_slots")
        return list(range(slot * self._blocks_per_slot, (slot + 1) * self._blocks_per_slot))

    def forward(
        self, tokens: list[list[int]], tables: list[list[int]], starts: list[int], last_only: bool
    ) -> torch.Tensor:
        """Run every row's new tokens in one forward pass; return float32 logits.

        tokens[i] are the new tokens of a sequence whose block table is tables[i] and which already
        holds starts[i] tokens in the cache; rows may differ in length (prompt chunks beside decode
        tokens). Returns [B, V] for each row's last token if last_only, else [B, T, V] (rows of
        equal length T).
        """
        if not last_only and any(len(row) != len(tokens[0]) for row in tokens):
            raise ValueError("all positions of every row are available only when rows have equal lengths")
        scored = [1 if last_only else len(row) for row in tokens]
        logits = torch.stack(self.forward_scored(tokens, tables, starts, scored))
        return logits[:, 0] if last_only else logits

    @torch.inference_mode()
    def forward_scored(
        self, tokens: list[list[int]], tables: list[list[int]], starts: list[int], scored: list[int]
    ) -> list[torch.Tensor]:
        """Like forward, but row i gets logits for its last scored[i] tokens: [scored[i], V] each.

        One forward for rows that need different numbers of predictions: a prompt chunk needs its
        last, a row verifying k draft tokens needs k + 1.
        """
        batch = ForwardBatch.build(
            tokens, tables, starts, self.block_size, self.sliding_window, self.heads_per_kv, self.kernels
        )
        hidden = self.module(batch.tokens, self.cache, batch)
        index = [
            i for o, n, m in zip(batch.offsets, batch.lengths, scored, strict=True) for i in range(o + n - m, o + n)
        ]
        logits = self.module.logits(hidden[torch.tensor(index, dtype=torch.long)])
        return list(logits.split(scored))
