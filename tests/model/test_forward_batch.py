"""Ragged forward passes: rows of any lengths in one forward give each row's own logits."""

import pytest
import torch
import transformers
from tiny_models import save_tiny

from tandem.engine.model_runner import ModelRunner
from tandem.kernels import kernels_available
from tandem.model import load_model
from tandem.model.forward_batch import CachedGroup, ForwardBatch, FreshGroup, VarlenGroup, split_long_rows


def test_split_long_rows_takes_out_a_long_row_among_short_ones():
    key_lens = [20, 25, 400, 30, 22, 18, 24, 21]
    singles, rest = split_long_rows(key_lens, call_keys=100)
    assert singles == [2]
    assert rest == [0, 1, 3, 4, 5, 6, 7]


def test_split_long_rows_keeps_similar_rows_together():
    singles, rest = split_long_rows([100, 120, 110, 90], call_keys=100)
    assert singles == [] and rest == [0, 1, 2, 3]


def test_split_long_rows_weighs_the_call_cost():
    key_lens = [20, 20, 20, 60]
    assert split_long_rows(key_lens, call_keys=1000) == ([], [0, 1, 2, 3])
    assert split_long_rows(key_lens, call_keys=10) == ([3], [0, 1, 2])


def test_build_groups_fresh_prompts_and_decode_rows_and_writes_through_the_block_tables():
    tables = [[3, 9], [0, 4], [1], [5, 2]]
    batch = ForwardBatch.build([[5, 6, 7], [8], [9], [1, 2]], tables, starts=[0, 10, 4, 6], block_size=8)
    kinds = sorted(type(g).__name__ for g in batch.groups)
    assert kinds == ["CachedGroup", "CachedGroup", "FreshGroup"]
    decode = next(g for g in batch.groups if isinstance(g, CachedGroup) and g.num_new == 1)
    assert (decode.num_rows, decode.num_new, decode.key_len) == (2, 1, 11)
    assert decode.tables.tolist() == [[0, 4], [1, 0]]  # each row's blocks, padded with block 0
    # Every input row's tokens sit at its offset, in order, with their positions and write places.
    for i, (row, start) in enumerate([([5, 6, 7], 0), ([8], 10), ([9], 4), ([1, 2], 6)]):
        span = slice(batch.offsets[i], batch.offsets[i] + len(row))
        assert batch.tokens[span].tolist() == row
        positions = list(range(start, start + len(row)))
        assert batch.positions[span].tolist() == positions
        assert batch.write_blocks[span].tolist() == [tables[i][p // 8] for p in positions]
        assert batch.write_offsets[span].tolist() == [p % 8 for p in positions]
    last = [o + n - 1 for o, n in zip(batch.offsets, batch.lengths, strict=True)]
    assert batch.tokens[last].tolist() == [7, 8, 9, 2]


def test_build_puts_every_short_cached_row_in_one_varlen_group():
    rows = [[5, 6, 7], [8], [9, 1, 2], [4] * 40, [3]]
    tables = [[3], [0, 6], [1], [5, 8, 9, 10, 11, 12, 13, 14, 15], [7, 2]]
    batch = ForwardBatch.build(rows, tables, starts=[0, 10, 4, 100, 2], block_size=16, kernels=True)
    varlen = next(g for g in batch.groups if isinstance(g, VarlenGroup))
    # Rows 1, 2, 4 (decode and verification widths) in one call; the fresh prompt and the 40-token
    # continuing chunk keep their own groups. Each row's table is cut to the blocks it covers.
    assert varlen.tables.tolist() == [[0], [1], [7]] and varlen.lengths.tolist() == [1, 3, 1]
    assert varlen.starts.tolist() == [10, 4, 2] and varlen.offsets.tolist() == [0, 1, 4]
    assert (varlen.lo, varlen.hi) == (0, 5)
    assert sorted(type(g).__name__ for g in batch.groups) == ["CachedGroup", "FreshGroup", "VarlenGroup"]
    assert isinstance(batch.groups[-1], FreshGroup)


def test_build_refuses_empty_rows_and_tables_too_short():
    with pytest.raises(ValueError, match="at least one new token"):
        ForwardBatch.build([[1], []], [[0], [1]], [0, 0], 16)
    with pytest.raises(ValueError, match="does not cover"):
        ForwardBatch.build([[1], [2]], [[0], [1]], [3, 16], 16)


@pytest.mark.parametrize(
    "kernels", [False, pytest.param(True, marks=pytest.mark.skipif(not kernels_available(), reason="no C kernels"))]
)
@pytest.mark.parametrize("window", [None, 16])
def test_ragged_forwards_match_transformers(tmp_path, window, kernels):
    """Prompt chunks, continuing chunks and decode rows of very different lengths, mixed in each
    forward (with a long row attending on its own), give every row the logits transformers gives
    that sequence alone."""
    overrides = {} if window is None else {"sliding_window": window}
    path = save_tiny("mistral", tmp_path / "m", **overrides)
    ours = load_model(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(3)
    lengths = {0: 250, 2: 9, 3: 40, 5: 12, 6: 7}  # sequence -> its length
    seqs = {slot: torch.randint(3, ours.config.vocab_size, (n,), generator=gen).tolist() for slot, n in lengths.items()}
    with torch.no_grad():
        expected = {slot: hf(torch.tensor([ids])).logits[0] for slot, ids in seqs.items()}
    runner = ModelRunner(ours.module, num_blocks=8 * 16, block_size=16, max_len=256, kernels=kernels)
    order = torch.randperm(8 * 16, generator=gen).tolist()  # each sequence's blocks scattered in the pool
    tables = {slot: order[slot * 16 : (slot + 1) * 16] for slot in seqs}
    # Per forward: sequence -> how many tokens to feed next.
    schedule = [
        {0: 200, 2: 3, 3: 40, 6: 1},  # fresh prompts of several lengths, and a one-token prompt
        {0: 45, 2: 1, 5: 4, 6: 1},  # a continuing chunk beside decode rows and a fresh prompt
        {0: 1, 2: 1, 5: 1, 6: 1},  # decode: one long row among short ones
        {0: 4, 2: 4, 5: 4, 6: 4},  # verification-shaped rows
    ]
    done = dict.fromkeys(seqs, 0)
    for step in schedule:
        slots = list(step)
        rows = [seqs[s][done[s] : done[s] + step[s]] for s in slots]
        row_tables = [tables[s] for s in slots]
        logits = runner.forward(rows, row_tables, [done[s] for s in slots], last_only=True)
        if step == schedule[2]:
            groups = ForwardBatch.build(rows, row_tables, [done[s] for s in slots], 16).groups
            assert sorted(g.num_rows for g in groups) == [1, 3], "the long row attends alone"
        for i, s in enumerate(slots):
            done[s] += step[s]
            torch.testing.assert_close(logits[i], expected[s][done[s] - 1], atol=1e-4, rtol=0)


def test_all_positions_need_rows_of_equal_length(tiny_llama_dir):
    runner = ModelRunner.with_slots(load_model(tiny_llama_dir).module, num_slots=2, max_len=64)
    tables = [runner.slot_table(0), runner.slot_table(1)]
    assert runner.forward([[5, 6], [7, 8]], tables, [0, 0], last_only=False).shape[:2] == (2, 2)
    with pytest.raises(ValueError, match="equal lengths"):
        runner.forward([[5, 6], [7]], tables, [2, 2], last_only=False)
