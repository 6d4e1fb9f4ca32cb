"""ForwardBatch: one forward pass over ragged rows: where each token reads and writes keys and values.

A row is one sequence's new tokens: a prompt chunk, a decode token, or a token plus draft proposals
to verify. The KV cache is paged: a pool of fixed-size blocks, and each row comes with its
sequence's block table (position p lives in block table[p // block_size] at offset p % block_size;
sequences sharing a prefix share its blocks). Rows of any lengths share one forward: their tokens are
laid out flat ([N, hidden]), so every Linear runs once over all of them (vLLM's flattened batch),
and only attention is split into groups:

- a fresh prompt (a row starting at position 0) attends causally over its own new keys;
- with the C kernels (tandem.kernels), every row of up to VARLEN_MAX_NEW new tokens reads its own
  keys from the cache through its block table in one varlen call, whatever its length;
- otherwise rows with equally many new tokens gather their blocks from the cache together, up to
  the longest row's length. A row much longer than the others gets its own group, so the short rows
  do not gather (and mask out) keys up to the long row's length: decode attention reads the cache,
  and a few long sequences would otherwise set the bytes read for every row.

Built once per forward (not per layer) from plain lists, so the engine's queue logic stays free of
tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "ForwardBatch",
    "FreshGroup",
    "CachedGroup",
    "VarlenGroup",
    "split_long_rows",
    "SPLIT_CALL_KEYS",
    "VARLEN_MAX_NEW",
]

# What one extra attention call costs, in keys read: ~15 us of dispatch per call against ~27 ns per
# key (both kv heads, head_dim 64, fp32) on the 2-core AVX-512 machine. Larger heads make keys
# dearer, so this errs toward fewer calls.
SPLIT_CALL_KEYS = 512
_MAX_SPLITS = 8
# Rows with more new tokens than this (prompt chunks after the first) go to SDPA, whose blocked
# matmuls win once there are many queries per key; decode and verification rows are the varlen kernel's.
VARLEN_MAX_NEW = 16


@dataclass(frozen=True)
class FreshGroup:
    """One prompt from position 0: flat tokens [lo, hi) attend causally to each other only."""

    lo: int
    hi: int
    mask: torch.Tensor | None  # [1, 1, T, T] bool for a sliding window shorter than T; else plain causal


@dataclass(frozen=True)
class CachedGroup:
    """`num_rows` rows of `num_new` tokens each (flat tokens [lo, hi), row-major) reading keys
    0..key_len-1 of their sequences from the cache, gathered through their block tables."""

    lo: int
    hi: int
    num_rows: int
    num_new: int
    key_len: int
    tables: torch.Tensor  # [R, ceil(key_len / block_size)] long: each row's blocks (padded with block 0)
    # [R, 1, G * T, key_len] bool, True = attend, query rows ordered (head within its kv group,
    # position) as attention stacks them (G = query heads per kv head; 1 for T = 1, which
    # broadcasts); None = every key, every query.
    mask: torch.Tensor | None


@dataclass(frozen=True)
class VarlenGroup:
    """Rows reading their own keys from the cache in one kernel call (tandem.kernels.varlen_attention):
    flat tokens [lo, hi); row r's tokens start at lo + offsets[r] ([R] long tensors); tables: [R, W]
    long, each row's block table (padded with block 0)."""

    lo: int
    hi: int
    offsets: torch.Tensor
    lengths: torch.Tensor
    tables: torch.Tensor
    starts: torch.Tensor


@dataclass(frozen=True)
class ForwardBatch:
    tokens: torch.Tensor  # [N] long, flat
    positions: torch.Tensor  # [N] long: absolute position of each token (its rotary angle)
    write_blocks: torch.Tensor  # [N] long: the cache block each token's keys and values are written to
    write_offsets: torch.Tensor  # [N] long: and the offset inside that block
    groups: tuple[FreshGroup | CachedGroup | VarlenGroup, ...]
    offsets: list[int]  # flat index of each input row's first token, in input order
    lengths: list[int]  # each input row's number of new tokens, in input order
    kernels: bool = False  # the C kernels serve this forward: varlen attention and fused float32 layer ops

    @property
    def decode_only(self) -> bool:
        """Every row reads its own keys in one varlen group (no prompt chunk): the fused decoder's case."""
        return len(self.groups) == 1 and isinstance(self.groups[0], VarlenGroup)

    @staticmethod
    def build(
        tokens: list[list[int]],
        tables: list[list[int]],
        starts: list[int],
        block_size: int,
        sliding_window: int | None = None,
        heads_per_kv: int = 1,
        kernels: bool = False,
    ) -> ForwardBatch:
        """tokens[i]: the new tokens of row i, which go after the starts[i] tokens its sequence
        already has in the cache; tables[i]: that sequence's block table (blocks of block_size
        positions), covering at least starts[i] + len(tokens[i]) positions. A row writes only its
        own new positions, which no other row reads. heads_per_kv: the model's query heads per kv
        head, so masks come in the shape attention uses (built once, not once per layer). kernels:
        the C kernels are loaded: cached rows of up to VARLEN_MAX_NEW new tokens go in one
        VarlenGroup, and the layers use the fused float32 ops."""
        if not tokens or any(not row for row in tokens):
            raise ValueError("every row needs at least one new token")
        needed = [-(-(start + len(row)) // block_size) for row, start in zip(tokens, starts, strict=True)]
        if any(len(table) < need for table, need in zip(tables, needed, strict=True)):
            raise ValueError("a row's block table does not cover its new tokens")
        tables = [table[:need] for table, need in zip(tables, needed, strict=True)]
        fresh, by_width, own_keys = [], {}, []
        for i, row in enumerate(tokens):
            if starts[i] == 0 and len(row) > 1:
                fresh.append(i)
            elif kernels and len(row) <= VARLEN_MAX_NEW:
                own_keys.append(i)
            else:
                by_width.setdefault(len(row), []).append(i)
        order: list[list[int]] = [own_keys] if own_keys else []  # groups of input rows, in flat order
        for width, members in by_width.items():
            singles, rest = split_long_rows([starts[i] + width for i in members])
            order += [[members[j]] for j in singles]
            if rest:
                order.append([members[j] for j in rest])
        order += [[i] for i in fresh]

        offsets, groups, flat, flat_pos, blocks, within = [0] * len(tokens), [], [], [], [], []
        for members in order:
            lo = len(flat)
            for i in members:
                offsets[i] = len(flat)
                flat += tokens[i]
                span = range(starts[i], starts[i] + len(tokens[i]))
                flat_pos += span
                table = tables[i]
                blocks += [table[p // block_size] for p in span]
                within += [p % block_size for p in span]
            if members is own_keys:
                groups.append(
                    VarlenGroup(
                        lo,
                        len(flat),
                        _as_long([offsets[i] - lo for i in members]),
                        _as_long([len(tokens[i]) for i in members]),
                        _padded([tables[i] for i in members]),
                        _as_long([starts[i] for i in members]),
                    )
                )
            elif len(members) == 1 and starts[members[0]] == 0 and len(tokens[members[0]]) > 1:
                groups.append(FreshGroup(lo, len(flat), _window_mask(len(tokens[members[0]]), sliding_window)))
            else:
                groups.append(
                    _cached_group(
                        lo,
                        len(flat),
                        [tables[i] for i in members],
                        [starts[i] for i in members],
                        len(tokens[members[0]]),
                        sliding_window,
                        heads_per_kv,
                    )
                )
        return ForwardBatch(
            tokens=_as_long(flat),
            positions=_as_long(flat_pos),
            write_blocks=_as_long(blocks),
            write_offsets=_as_long(within),
            groups=tuple(groups),
            offsets=offsets,
            lengths=[len(row) for row in tokens],
            kernels=kernels,
        )


def split_long_rows(key_lens: list[int], call_keys: int | None = None) -> tuple[list[int], list[int]]:
    """Which rows attend alone (longest first) and which together, minimising keys read plus
    call_keys (default SPLIT_CALL_KEYS) per extra call. Rows together each read keys up to their
    longest key length. Returns (single row indices, grouped row indices)."""
    call_keys = SPLIT_CALL_KEYS if call_keys is None else call_keys
    by_len = sorted(range(len(key_lens)), key=lambda i: -key_lens[i])

    def together_cost(rest: list[int]) -> int:
        return len(rest) * max(key_lens[i] for i in rest)

    best_j, best_cost = 0, together_cost(by_len)
    alone = 0
    for j in range(1, min(len(by_len), _MAX_SPLITS + 1)):
        alone += key_lens[by_len[j - 1]] + call_keys
        cost = alone + together_cost(by_len[j:])
        if cost < best_cost:
            best_j, best_cost = j, cost
    return by_len[:best_j], sorted(by_len[best_j:])


def _as_long(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def _padded(tables: list[list[int]]) -> torch.Tensor:
    """Block tables as one [R, W] tensor, W the longest; shorter rows padded with block 0 (never
    read: a row reads only the positions its length covers)."""
    width = max(len(t) for t in tables)
    return _as_long([t + [0] * (width - len(t)) for t in tables])


def _window_mask(num_new: int, window: int | None) -> torch.Tensor | None:
    if window is None or num_new <= window:
        return None
    pos = torch.arange(num_new)
    return ((pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window))[None, None]


def _cached_group(
    lo: int,
    hi: int,
    tables: list[list[int]],
    starts: list[int],
    num_new: int,
    window: int | None,
    heads_per_kv: int,
) -> CachedGroup:
    key_len = max(starts) + num_new
    table_t = _padded(tables)
    # One row decoding one token sees every key it has (unless a sliding window cuts some off).
    if len(tables) == 1 and num_new == 1 and (window is None or key_len <= window):
        return CachedGroup(lo, hi, 1, 1, key_len, table_t, None)
    positions = torch.tensor(starts, dtype=torch.long)[:, None] + torch.arange(num_new)[None, :]
    keys = torch.arange(key_len)
    allowed = keys[None, None, :] <= positions[:, :, None]  # [R, T, K]
    if window is not None:
        allowed &= keys[None, None, :] > positions[:, :, None] - window
    mask = allowed[:, None]
    if num_new > 1 and heads_per_kv > 1:  # each position's mask once per query head of the kv group
        mask = mask.unsqueeze(2).expand(-1, -1, heads_per_kv, -1, -1).reshape(mask.shape[0], 1, -1, key_len)
    return CachedGroup(lo, hi, len(tables), num_new, key_len, table_t, mask)
