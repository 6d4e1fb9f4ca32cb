"""PrefixCache: hash chains of full blocks over KV slots: hits, adoption vs copy, LRU eviction, counters."""

import pytest
from staggered import run_staggered

from tandem.engine import prefix_cache as pc
from tandem.engine.prefix_cache import PrefixCache, block_hashes

B = 4  # block size


def run(cache: PrefixCache, ids: list[int], slot_release: bool = True):
    """Admit ids, compute them all (as the engine would), then finish the sequence."""
    hit = cache.admit(ids)
    cache.commit(hit.slot, len(ids), ids)
    if slot_release:
        cache.release(hit.slot)
    return hit


def test_block_hashes_chain_over_full_blocks_only():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], B)
    assert len(a) == 2  # the ninth token is not a full block
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 9], B)[0] == a[0] != block_hashes([1, 2, 3, 4, 5, 6, 7, 9], B)[1]
    # A block's hash depends on everything before it, not only on its own tokens.
    assert block_hashes([0, 0, 0, 0, 5, 6, 7, 8], B)[1] != a[1]


def test_a_finished_prompt_is_reused_in_place_up_to_its_last_token():
    cache = PrefixCache(num_slots=2, block_size=B)
    ids = list(range(10))
    first = run(cache, ids)
    assert first.num_tokens == 0 and first.copy_from is None
    again = cache.admit(ids)  # the same prompt: 8 cached tokens (two full blocks); the 10th is recomputed
    assert (again.slot, again.num_tokens, again.copy_from) == (first.slot, 8, None)
    cache.release(again.slot)
    longer = cache.admit([*ids, 10, 11, 12])
    assert longer.num_tokens == 8  # the third block (8..11) was never committed: only 10 tokens ran
    assert cache.num_queried_tokens == 10 + 10 + 13 and cache.num_hit_tokens == 16


def test_a_whole_prompt_of_full_blocks_keeps_its_last_token_to_compute():
    cache = PrefixCache(num_slots=1, block_size=B)
    run(cache, list(range(8)))
    assert cache.admit(list(range(8))).num_tokens == 7


def test_a_prefix_held_by_a_running_sequence_is_copied_into_another_slot():
    cache = PrefixCache(num_slots=3, block_size=B)
    shared = list(range(12))
    running = run(cache, [*shared, 50, 51], slot_release=False)
    hit = cache.admit([*shared, 60])
    assert hit.copy_from == running.slot and hit.slot != running.slot and hit.num_tokens == 12
    assert cache.ref_count(block_hashes(shared, B)[-1]) == 2  # both running slots pin the block


def test_blocks_are_registered_only_once_every_position_is_valid():
    cache = PrefixCache(num_slots=3, block_size=B)
    shared = list(range(8))
    running = run(cache, [*shared, 7], slot_release=False)  # 9 tokens: blocks 0-1
    copied = cache.admit([*shared, 1])  # the hit stops at 8 = two blocks; all 8 positions copied
    assert copied.num_tokens == 8
    third = cache.admit(shared + [3])  # copies from either running slot, never past what they hold
    assert third.num_tokens == 8 and third.copy_from in (running.slot, copied.slot)
    # A hit that ends inside a block registers only the blocks it fully covers.
    cache = PrefixCache(num_slots=2, block_size=B)
    run(cache, list(range(8)), slot_release=False)
    partial = cache.admit(list(range(8)))  # 7 tokens reused, block 1 is not complete in the new slot
    assert partial.num_tokens == 7
    assert cache.ref_count(block_hashes(list(range(8)), B)[1]) == 1


def test_misses_evict_the_least_recently_used_free_slot():
    cache = PrefixCache(num_slots=2, block_size=B)
    a, b, c = [list(range(k * 100, k * 100 + 9)) for k in (1, 2, 3)]
    slot_a = run(cache, a).slot
    slot_b = run(cache, b).slot
    assert cache.admit(a).slot == slot_a  # a used again: b is now the least recently used
    cache.release(slot_a)
    assert cache.admit(c).slot == slot_b  # c evicts b's blocks, not a's
    cache.release(slot_b)
    assert cache.num_evicted_blocks == 2
    assert cache.admit(a).num_tokens == 8  # a survived
    assert cache.admit(b).num_tokens == 0  # b did not


def test_a_miss_takes_a_free_slot_whose_reused_blocks_are_held_elsewhere_before_the_lru_one():
    cache = PrefixCache(num_slots=3, block_size=B)
    popular, system = list(range(100, 109)), list(range(200, 209))
    old = run(cache, popular)  # free, least recently used
    run(cache, popular)  # a hit: the popular prompt's blocks count as reused
    first = cache.admit([*system, 1])
    cache.commit(first.slot, 10, [*system, 1])
    second = cache.admit([*system, 2])  # copied from the first: both hold the system prompt
    assert second.copy_from == first.slot
    cache.commit(second.slot, 10, [*system, 2])
    cache.release(second.slot)  # free, and its reused blocks are still held by the running first
    victim = cache.admit(list(range(300, 309)))  # a miss
    assert victim.slot == second.slot != old.slot  # not the LRU slot: that one holds the only popular copy
    assert cache.admit(popular).num_tokens == 8


def test_a_hash_collision_never_serves_another_prompts_keys(monkeypatch):
    monkeypatch.setattr(pc, "hash_block", lambda parent, tokens: 42)  # every block collides
    cache = PrefixCache(num_slots=2, block_size=B)
    run(cache, list(range(9)))
    assert cache.admit(list(range(100, 109))).num_tokens == 0


def test_output_tokens_are_cached_too_for_the_next_turn():
    cache = PrefixCache(num_slots=1, block_size=B)
    turn1, reply = list(range(6)), [70, 71, 72, 73]
    hit = cache.admit(turn1)
    cache.commit(hit.slot, 9, turn1, reply)  # the last sampled token (73) was never fed: no KV
    cache.release(hit.slot)
    assert cache.admit([*turn1, *reply, 80, 81]).num_tokens == 8


def test_prompt_logprob_requests_and_a_disabled_cache_reuse_nothing():
    cache = PrefixCache(num_slots=2, block_size=B)
    run(cache, list(range(9)))
    skipped = cache.admit(list(range(9)), use_cache=False)
    assert skipped.num_tokens == 0 and cache.num_queried_tokens == 9  # not counted as a query
    off = PrefixCache(num_slots=3, block_size=B, enabled=False)
    first = run(off, list(range(9)))
    assert off.admit(list(range(9))).num_tokens == 0 and first.slot == 0
    assert off.num_queried_tokens == 0 and off.num_cached_blocks == 0


def test_no_free_slot_is_an_error_and_a_bad_block_size_is_refused():
    cache = PrefixCache(num_slots=1, block_size=B)
    cache.admit([1, 2])
    with pytest.raises(RuntimeError, match="no free KV slot"):
        cache.admit([1, 2])
    with pytest.raises(ValueError, match="block size"):
        PrefixCache(num_slots=1, block_size=0)


# -- through the engine: greedy output identical with the cache on and off ---------------------------

FAMILIES = [[0, *[(7 * f + 3 * i) % 300 + 10 for i in range(41)]] for f in range(3)]  # 42-token "system prompts"
REQUESTS = [
    (f, [200 + 5 * r + j for j in range(2 + 7 * r % 23)]) for r, f in enumerate([0, 1, 0, 2, 1, 0, 2, 2, 1, 0, 1, 2])
]


@pytest.fixture(scope="module")
def tiny_model(tiny_llama_dir):
    from tandem.model import load_model

    return load_model(tiny_llama_dir)


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "torch"])
def test_greedy_output_is_identical_with_prefix_caching_on_and_off(tiny_model, kernels):
    from tandem.engine import Engine, EngineConfig, SamplingParams

    params = [SamplingParams.greedy_params(4 + 3 * (i % 4), ignore_eos=True) for i in range(len(REQUESTS))]
    runs = {}
    for caching in (False, True):
        # Three slots for twelve requests: slots are taken over again and again (evictions), and a
        # 20-token prefill budget splits prompts, so chunks after a cached prefix attend to reused keys.
        config = EngineConfig(
            max_model_len=128, kv_cache_tokens=128 * 3, max_prefill_tokens=20, enable_prefix_caching=caching,
            prefix_block_size=8,
        )  # fmt: skip
        engine = Engine(tiny_model, config)
        engine.runner.kernels = engine.runner.kernels and kernels
        copies = []
        schedule = engine.batcher.schedule

        def spy(schedule=schedule, copies=copies):
            plan = schedule()
            copies.extend(plan.copies)
            return plan

        engine.batcher.schedule = spy
        runs[caching] = run_staggered(engine, [FAMILIES[f] + tail for f, tail in REQUESTS], params), engine, copies
    (off, engine_off, _), (on, engine_on, copies) = runs[False], runs[True]
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    cache = engine_on.batcher.prefix_cache
    assert engine_on.prefix_cache_hits >= 6 * 40  # most requests reused their family's 40-token prefix
    assert engine_on.prefix_cache_queries == sum(len(FAMILIES[f]) + len(t) for f, t in REQUESTS)
    assert cache.num_evicted_blocks > 0 and copies  # slots were taken over, and running prefixes copied
    assert sum(o.num_cached_tokens for o in on) == engine_on.prefix_cache_hits
    assert engine_on.num_prompt_tokens == engine_off.num_prompt_tokens - engine_on.prefix_cache_hits
    assert engine_off.prefix_cache_hits == engine_off.prefix_cache_queries == 0


def simulated_hit_rate(prompts: int, slots: int, concurrent: int, requests: int = 400, seed: int = 0) -> float:
    """Closed-loop traffic on one replica's cache alone: `concurrent` sequences at a time, each a
    random one of `prompts` 400-token system prompts plus its own tail, running 5 steps."""
    import random

    rng = random.Random(seed)
    systems = [[1000 * p + i for i in range(400)] for p in range(prompts)]
    cache = PrefixCache(num_slots=slots, block_size=16)
    running = []  # (steps left, slot, ids)
    for r in range(requests):
        while len(running) >= concurrent:
            running = [(left - 1, slot, ids) for left, slot, ids in running]
            for _, slot, ids in [item for item in running if item[0] == 0]:
                cache.commit(slot, len(ids), ids)
                cache.release(slot)
            running = [item for item in running if item[0] > 0]
        ids = [*rng.choice(systems), 900_000 + r, 7, 8]
        hit = cache.admit(ids)
        cache.commit(hit.slot, len(ids), ids)
        running.append((5, hit.slot, ids))
    return cache.num_hit_tokens / cache.num_queried_tokens


def test_a_replica_that_sees_fewer_distinct_prompts_hits_more():
    """What prefix-affinity routing buys: half the prompts per replica, many more hits."""
    sticky, spread = simulated_hit_rate(4, 6, 3), simulated_hit_rate(8, 6, 3)
    assert sticky > 0.85 and spread < 0.7, (sticky, spread)
