"""Batcher: FCFS admission into KV slots, chunked prefill under a budget, slots freed at once."""

from tandem.engine.batcher import Batcher, KVCopy
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


def test_a_cached_prefix_skips_prefill_and_a_running_ones_is_copied_in_the_plan():
    b = Batcher(num_slots=3, max_prefill_tokens=100, prefix_caching=True, block_size=4)
    first = seq("first", prompt_len=10)
    b.add(first)
    b.schedule()
    first.num_computed = 10  # the engine ran the whole prompt and sampled a token
    first.append(7)
    second = seq("second", prompt_len=10)  # the same prompt, while the first still runs
    b.add(second)
    plan = b.schedule()
    assert plan.copies == [KVCopy(first.slot, second.slot, 8)] and second.slot != first.slot
    assert second.num_computed == second.num_cached_tokens == 8
    assert [(s.request_id, n) for s, n in plan.prefill] == [("second", 2)] and plan.decode == [first]
    first_slot = first.slot
    first.finish("stop")
    b.release_finished()
    third = seq("third", prompt_len=10)
    b.add(third)
    plan = b.schedule()
    assert third.slot == first_slot and not plan.copies  # adopted in place: nothing to copy
    assert b.prefix_cache.num_hit_tokens == 16
