"""The varlen attention kernel against torch's SDPA, one row at a time with an explicit mask, over
a paged cache read through block tables (scattered blocks, a prefix block shared by two rows)."""

import math

import pytest
import torch
import torch.nn.functional as F

from tandem.kernels import kernels_available, varlen_attention

pytestmark = pytest.mark.skipif(not kernels_available(), reason="C kernels not built on this machine")


def gathered(cache, table, length):
    """[kv_heads, length, head_dim]: a row's keys (or values) in position order, through its table."""
    blocks = cache[:, torch.tensor(table)]  # [kv_heads, blocks, block_size, head_dim]
    return blocks.reshape(cache.shape[0], -1, cache.shape[3])[:, :length]


def reference(q, keys, values, rows, window):
    out = []
    for offset, length, table, start in rows:
        group = q.shape[1] // keys.shape[0]
        k = gathered(keys, table, start + length).float().repeat_interleave(group, 0)
        v = gathered(values, table, start + length).float().repeat_interleave(group, 0)
        pos = torch.arange(start, start + length)[:, None]
        key = torch.arange(start + length)[None, :]
        mask = key <= pos
        if window:
            mask &= key > pos - window
        qq = q[offset : offset + length].float().transpose(0, 1)
        out.append(F.scaled_dot_product_attention(qq, k, v, attn_mask=mask).transpose(0, 1))
    return torch.cat(out)


def run_case(rows_spec, heads, kv_heads, head_dim, cache_dtype, window, strided_q=True, block_size=16):
    gen = torch.Generator().manual_seed(len(rows_spec) * 31 + heads)
    per_row = -(-600 // block_size)
    num_blocks = len(rows_spec) * per_row
    keys = torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=gen).to(cache_dtype)
    values = torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=gen).to(cache_dtype)
    total = sum(length for length, _ in rows_spec)
    if strided_q:  # q as the model has it: a view into the fused q|k|v projection
        q = torch.randn(total, heads + 2 * kv_heads, head_dim, generator=gen)[:, :heads]
    else:
        q = torch.randn(total, heads, head_dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()  # every row's blocks scattered in the pool
    tables = [order[i * per_row : (i + 1) * per_row] for i in range(len(rows_spec))]
    if len(tables) > 1:
        tables[1][0] = tables[0][0]  # rows 0 and 1 share their first block (a cached prefix)
    rows, offset = [], 0
    for (length, start), table in zip(rows_spec, tables, strict=True):
        rows.append((offset, length, table, start))
        offset += length
    as_long = lambda i: torch.tensor([r[i] for r in rows], dtype=torch.long)
    got = varlen_attention(q, keys, values, as_long(0), as_long(1), as_long(2), as_long(3), window)
    torch.testing.assert_close(got, reference(q, keys, values, rows, window), atol=2e-5, rtol=1e-4)


# (new tokens, keys already cached)
MIXED = [(1, 10), (1, 300), (4, 50), (1, 0), (3, 127), (1, 598), (16, 200)]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4), (8, 1)])
def test_mixed_rows_match_sdpa(cache_dtype, heads, kv_heads):
    run_case(MIXED, heads, kv_heads, 64, cache_dtype, window=None)


@pytest.mark.parametrize("window", [1, 7, 64, 200])
def test_sliding_window_matches_sdpa(window):
    """Windows shorter than a key tile leave whole tiles masked for some queries."""
    run_case(MIXED, 6, 2, 64, torch.float32, window)


def test_other_head_dims_block_sizes_and_contiguous_queries():
    run_case([(1, 40), (2, 9)], 4, 2, 128, torch.bfloat16, None, strided_q=False)
    run_case([(5, 31)], 2, 1, 32, torch.float32, 5)
    run_case(MIXED, 6, 2, 64, torch.float32, 7, block_size=5)  # not a multiple of 16: the generic path
    run_case(MIXED, 6, 2, 64, torch.bfloat16, None, block_size=128)  # tiles of a whole block
    run_case(MIXED, 10, 2, 80, torch.bfloat16, None)  # head_dim 80 (Phi-style): generic on AVX-512, 8-lane on AVX2
    run_case(MIXED, 4, 2, 20, torch.float32, 9)  # head_dim 20, no multiple of 8: the generic path on every host
    run_case(MIXED, 4, 4, 256, torch.float32, 64)  # the largest head_dim the kernel takes


def test_bfloat16_queries_come_back_in_bfloat16():
    keys = values = torch.randn(1, 2, 16, 8)  # one kv head, two blocks
    q = torch.randn(3, 2, 8).to(torch.bfloat16)
    idx = torch.tensor([0]), torch.tensor([3]), torch.tensor([[1]]), torch.tensor([2])
    out = varlen_attention(q, keys, values, *idx)
    assert out.dtype == torch.bfloat16 and out.shape == (3, 2, 8)
    # The first token sees keys 0..2 of block 1 only: a softmax-weighted mix of those values.
    weights = torch.softmax(q[0].float() @ keys[0, 1, :3].T / math.sqrt(8), dim=-1)
    torch.testing.assert_close(out[0].float(), weights @ values[0, 1, :3], atol=2e-2, rtol=2e-2)


def test_rejects_caches_it_cannot_read():
    q = torch.randn(1, 2, 8)
    idx = [torch.tensor([0]), torch.tensor([1]), torch.tensor([[0]]), torch.tensor([0])]
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        varlen_attention(
            q, torch.zeros(1, 1, 4, 8, dtype=torch.float16), torch.zeros(1, 1, 4, 8, dtype=torch.float16), *idx
        )
    with pytest.raises(ValueError, match="contiguous"):
        cache = torch.zeros(1, 1, 8, 8)[:, :, ::2]
        varlen_attention(q, cache, cache, *idx)


def test_refuses_block_tables_that_do_not_cover_the_rows():
    keys = torch.zeros(1, 4, 16, 8)
    q = torch.randn(1, 2, 8)
    with pytest.raises(ValueError, match="does not cover"):  # position 16 needs a second block
        varlen_attention(q, keys, keys, torch.tensor([0]), torch.tensor([1]), torch.tensor([[0]]), torch.tensor([16]))
    with pytest.raises(ValueError, match="one row per row"):
        varlen_attention(q, keys, keys, torch.tensor([0]), torch.tensor([1]), torch.tensor([0, 1]), torch.tensor([0]))
