"""Batcher: FCFS admission into running slots and KV blocks (one request's choices yielding to others
past their share), chunked prefill under a budget, cached prefix blocks shared, slots and blocks
freed at once."""

import pytest

from tandem.engine.batcher import Batcher
from tandem.engine.outputs import RequestMetrics
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.sequence import Sequence


class NoDetok:
    def push(self, token_id):
        return "x"


def seq(rid, prompt_len=4, max_tokens=3):
    return Sequence(
        rid,
        list(range(prompt_len)),
        SamplingParams(max_tokens=max_tokens),
        NoDetok(),
        frozenset(),
        100,
        RequestMetrics(0.0),
    )


def test_admits_fcfs_while_slots_are_free_and_the_rest_wait():
    b = Batcher(num_slots=2, max_prefill_tokens=100)
    seqs = [seq(f"r{i}") for i in range(4)]
    for s in seqs:
        b.add(s)
    plan = b.schedule()
    assert [s.request_id for s, _ in plan.prefill] == ["r0", "r1"]
    assert [s.request_id for s in b.waiting] == ["r2", "r3"]
    assert {s.slot for s in b.running} == {0, 1}


def test_finished_sequence_frees_its_slot_for_the_next_waiting_one():
    b = Batcher(num_slots=1, max_prefill_tokens=100)
    first, second = seq("a"), seq("b")
    b.add(first)
    b.add(second)
    b.schedule()
    first.num_computed = 4
    first.append(7)
    plan = b.schedule()
    assert plan.decode == [first] and not plan.prefill
    first.finish("stop")
    assert b.release_finished() == [first]
    assert first.slot is None and b.num_free_slots == 1
    plan = b.schedule()
    assert [s.request_id for s, _ in plan.prefill] == ["b"] and second.slot == 0


def test_prefill_is_chunked_under_the_token_budget():
    b = Batcher(num_slots=4, max_prefill_tokens=10)
    long, short = seq("long", prompt_len=25), seq("short", prompt_len=3)
    b.add(long)
    b.add(short)
    plan = b.schedule()
    assert [(s.request_id, n) for s, n in plan.prefill] == [("long", 10)]
    long.num_computed = 10
    plan = b.schedule()
    assert [(s.request_id, n) for s, n in plan.prefill] == [("long", 10)]
    long.num_computed = 20
    plan = b.schedule()
    assert [(s.request_id, n) for s, n in plan.prefill] == [("long", 5), ("short", 3)]


def test_abort_frees_slot_and_removes_waiting():
    b = Batcher(num_slots=1, max_prefill_tokens=100)
    a, w = seq("a"), seq("w")
    b.add(a)
    b.add(w)
    b.schedule()
    assert b.abort("w") is w and w.finish_reason == "abort" and not b.waiting
    assert b.abort("a") is a and b.num_free_slots == 1 and not b.running
    assert b.abort("missing") is None


def test_lowest_free_slot_is_reused_first_to_keep_the_batch_compact():
    b = Batcher(num_slots=3, max_prefill_tokens=100)
    seqs = [seq(f"r{i}") for i in range(3)]
    for s in seqs:
        b.add(s)
    b.schedule()
    seqs[0].finish("stop")
    b.release_finished()
    late = seq("late")
    b.add(late)
    b.schedule()
    assert late.slot == 0


def test_a_cached_prefix_skips_prefill_and_shares_the_running_sequences_blocks():
    b = Batcher(num_slots=3, max_prefill_tokens=100, prefix_caching=True, block_size=4, num_blocks=32)
    first = seq("first", prompt_len=10)
    b.add(first)
    b.schedule()
    assert len(first.block_table) == 3  # 10 prompt tokens in blocks of 4
    first.num_computed = 10  # the engine ran the whole prompt and sampled a token
    first.append(7)
    second = seq("second", prompt_len=10)  # the same prompt, while the first still runs
    b.add(second)
    free_before = b.kv.num_free_blocks
    plan = b.schedule()
    # Two full blocks (8 tokens) shared, not copied: the second takes one new block for tokens 8-9,
    # the first one more for its fed token (position 10 is in its third block already).
    assert second.block_table[:2] == first.block_table[:2] and second.block_table[2] != first.block_table[2]
    assert b.kv.num_free_blocks == free_before - 1
    assert second.num_computed == second.num_cached_tokens == 8
    assert [(s.request_id, n) for s, n in plan.prefill] == [("second", 2)] and plan.decode == [first]
    shared = first.block_table[:2]
    first.finish("stop")
    b.release_finished()
    assert [b.kv.pool.ref_count(x) for x in shared] == [1, 1]  # still the second's
    third = seq("third", prompt_len=10)
    b.add(third)
    b.schedule()
    assert third.block_table[:2] == shared and b.kv.num_hit_tokens == 16


def test_the_head_of_the_queue_waits_until_the_pool_can_promise_its_blocks():
    b = Batcher(num_slots=4, max_prefill_tokens=100, block_size=4, num_blocks=6)
    big, small = seq("big", prompt_len=10, max_tokens=6), seq("small", prompt_len=2, max_tokens=1)
    b.add(big)
    b.schedule()
    assert b.kv.reserved == 1 and b.kv.num_available_blocks == 2  # 16 tokens: 4 blocks, 3 taken by the prompt
    late = seq("late", prompt_len=8, max_tokens=4)  # needs 3 blocks: more than the pool can promise
    b.add(late)
    b.add(small)
    b.schedule()
    assert late.slot is None and small.slot is None and list(b.waiting) == [late, small]  # FCFS: small waits too
    big.finish("stop")
    b.release_finished()
    assert b.kv.num_available_blocks == 6 and b.kv.reserved == 0
    b.schedule()
    assert late.slot is not None and small.slot is not None


def grouped(rid, group):
    s = seq(rid)
    s.group = group
    return s


def test_a_request_at_its_share_yields_the_next_slot_to_a_neighbour():
    b = Batcher(num_slots=4, max_prefill_tokens=100, max_group_share=0.25)  # a group holds 1 slot while others wait
    big = [grouped(f"big-{i}", "big") for i in range(6)]
    for s in big:
        b.add(s)
    b.schedule()  # nobody else waits: the big request takes every free slot
    assert [s.request_id for s in b.running] == ["big-0", "big-1", "big-2", "big-3"]
    neighbour = grouped("small-0", "small")
    b.add(neighbour)
    big[0].finish("stop")
    b.release_finished()
    b.schedule()  # the freed slot goes to the neighbour, though big-4 and big-5 arrived first
    assert neighbour in b.running and [s.request_id for s in b.waiting] == ["big-4", "big-5"]
    for s in big[1:3]:
        s.finish("stop")
    b.release_finished()
    b.schedule()  # nobody else waits again: big takes the free slots in order
    assert [s.request_id for s in b.running][-2:] == ["big-4", "big-5"] and not b.waiting


def test_waiting_requests_take_the_free_slots_in_turns_fewest_held_first():
    b = Batcher(num_slots=4, max_prefill_tokens=100, max_group_share=0.5)
    order = [grouped("a0", "a"), grouped("a1", "a"), grouped("a2", "a"), seq("x"), grouped("b0", "b"), seq("y")]
    for s in order:
        b.add(s)
    b.schedule()
    # one each in the order they came (an ungrouped sequence is a request of its own)
    assert [s.request_id for s in b.running] == ["a0", "x", "b0", "y"]
    assert [s.request_id for s in b.waiting] == ["a1", "a2"]


def test_requests_within_their_share_do_not_fill_the_slots_ahead_of_a_later_one():
    b = Batcher(num_slots=4, max_prefill_tokens=100, max_group_share=0.5)
    for group in ("a", "b", "c"):
        for i in range(4):
            b.add(grouped(f"{group}{i}", group))
    b.add(grouped("late", "late"))
    b.schedule()
    assert [s.request_id for s in b.running] == ["a0", "b0", "c0", "late"]


def test_the_share_must_be_a_fraction():
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match="max_group_share"):
            Batcher(num_slots=4, max_prefill_tokens=100, max_group_share=share)


def test_waiting_requests_are_admitted_by_priority_lowest_first_then_in_arrival_order():
    b = Batcher(num_slots=1, max_prefill_tokens=64)
    for rid, priority in [("late-batch", 1), ("first", 0), ("urgent", -1), ("second", 0)]:
        s = seq(rid)
        s.priority = priority
        b.add(s)
    admitted = []
    while b.has_unfinished():
        plan = b.schedule()
        for s, _ in plan.prefill:
            admitted.append(s.request_id)
            s.finish("stop")
        b.release_finished()
    assert admitted == ["urgent", "first", "second", "late-batch"]
