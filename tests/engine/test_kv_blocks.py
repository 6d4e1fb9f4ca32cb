"""KVBlocks and BlockPool: hash chains of full blocks, sharing (one copy per prefix, reference-counted),
LRU eviction (tail first), reservations, collisions, counters; and through the engine, greedy output
identical with the block cache on and off."""

import pytest
from staggered import run_staggered

from tandem.contracts import kv_block_hash, kv_block_hashes
from tandem.engine.kv_blocks import BlockPool, KVBlocks
from tandem.engine.outputs import RequestMetrics
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.sequence import Sequence

B = 4  # block size


class NoDetok:
    def push(self, token_id):
        return "x"


def seq(ids: list[int], max_tokens: int = 4, max_len: int = 64) -> Sequence:
    return Sequence(
        "r", list(ids), SamplingParams(max_tokens=max_tokens), NoDetok(), frozenset(), max_len, RequestMetrics(0.0)
    )


def computed(kv: KVBlocks, s: Sequence, output: list[int] = ()) -> Sequence:
    """As the engine runs it: the whole prompt (and output, all but the last token fed) computed."""
    kv.grow(s, len(s.prompt_ids))
    s.num_computed = len(s.prompt_ids)
    for token in output:
        s.output_ids.append(token)
        if len(s.output_ids) > 1:
            kv.grow(s, s.num_computed + 1)
            s.num_computed += 1
    kv.commit(s)
    return s


def run(kv: KVBlocks, ids: list[int], release: bool = True) -> Sequence:
    s = seq(ids)
    assert kv.admit(s)
    computed(kv, s)
    if release:
        kv.release(s)
    return s


class Recorder:
    def __init__(self):
        self.events = []

    def stored(self, h):
        self.events.append(("stored", h))

    def removed(self, h):
        self.events.append(("removed", h))


def test_block_hashes_are_the_contracts_chain_over_full_blocks_only():
    kv = KVBlocks(num_blocks=16, block_size=B, hash_seed=7)
    s = run(kv, list(range(10)), release=False)
    assert s.block_hashes == kv_block_hashes(list(range(10)), B, seed=7)  # what a gateway computes
    assert len(s.block_hashes) == 2  # tokens 8-9 are not a full block
    assert s.block_hashes[1] == kv_block_hash(s.block_hashes[0], [4, 5, 6, 7], 7)
    # A block's hash depends on everything before it, not only on its own tokens.
    assert kv_block_hashes([0, 0, 0, 0, 4, 5, 6, 7], B)[1] != kv_block_hashes(list(range(8)), B)[1]
    assert kv_block_hashes(list(range(8)), B, seed=1) != kv_block_hashes(list(range(8)), B, seed=2)


def test_two_sequences_with_one_prompt_hold_one_copy_of_its_blocks():
    kv = KVBlocks(num_blocks=16, block_size=B)
    prompt = list(range(13))  # blocks 0-2 full, token 12 in block 3
    first = run(kv, prompt, release=False)
    assert kv.num_free_blocks == 16 - 4
    second = seq(prompt)
    assert kv.admit(second) and second.num_computed == second.num_cached_tokens == 12
    computed(kv, second)
    # The second took its own block for token 12 only: three blocks are shared, read by both.
    assert kv.num_free_blocks == 16 - 5
    assert second.block_table[:3] == first.block_table[:3] and second.block_table[3] != first.block_table[3]
    assert [kv.pool.ref_count(b) for b in first.block_table] == [2, 2, 2, 1]
    kv.release(first)
    assert [kv.pool.ref_count(b) for b in second.block_table] == [1, 1, 1, 1] and kv.num_free_blocks == 16 - 4
    assert kv.num_queried_tokens == 26 and kv.num_hit_tokens == 12


def test_a_whole_prompt_of_full_blocks_keeps_its_last_block_to_compute():
    kv = KVBlocks(num_blocks=16, block_size=B)
    run(kv, list(range(8)))
    again = seq(list(range(8)))
    assert kv.admit(again) and again.num_computed == 4  # the block holding the last token is recomputed
    # ... in a block of its own: a sequence never writes a block another one reads.
    kv.grow(again, 8)
    assert kv.pool.ref_count(again.block_table[1]) == 1


def test_blocks_are_registered_only_once_every_position_is_computed():
    kv = KVBlocks(num_blocks=16, block_size=B)
    s = seq(list(range(10)))
    kv.admit(s)
    kv.grow(s, 6)
    s.num_computed = 6  # a prompt chunk of 6: block 0 full, block 1 half
    kv.commit(s)
    assert kv.pool.num_cached_blocks == 1
    other = seq(list(range(10)))
    assert kv.admit(other) and other.num_computed == 4


def test_output_tokens_are_cached_too_for_the_next_turn():
    kv = KVBlocks(num_blocks=16, block_size=B)
    turn1, reply = list(range(6)), [70, 71, 72, 73]
    s = seq(turn1)
    kv.admit(s)
    computed(kv, s, reply)  # 9 positions computed: the last sampled token (73) was never fed
    kv.release(s)
    nxt = seq([*turn1, *reply, 80, 81])
    assert kv.admit(nxt) and nxt.num_computed == 8


def test_freed_blocks_stay_cached_and_the_least_recently_used_go_first_tail_before_head():
    recorder = Recorder()
    kv = KVBlocks(num_blocks=6, block_size=B, events=recorder)
    a, b = list(range(100, 109)), list(range(200, 209))  # 9 tokens: 2 full blocks + 1 each
    run(kv, a)
    run(kv, b)
    assert kv.pool.num_cached_blocks == 4 and kv.num_free_blocks == 6
    run(kv, a[:8] + [1])  # a's blocks used again: now the most recently used
    run(kv, list(range(300, 313)))  # 4 blocks: the 2 free unregistered ones, then b's tail, then b's head
    hashes_a, hashes_b = kv_block_hashes(a, B), kv_block_hashes(b, B)
    assert [e for e in recorder.events if e[0] == "removed"] == [("removed", hashes_b[1]), ("removed", hashes_b[0])]
    assert kv.num_evicted_blocks == 2
    assert kv.pool.block_of(hashes_a[1]) is not None and kv.pool.block_of(hashes_b[0]) is None


def test_a_hash_collision_never_serves_another_prompts_keys():
    pool = BlockPool(num_blocks=4, block_size=B)
    block = pool.allocate()
    pool.register(block, 42, [1, 2, 3, 4])
    assert pool.longest_hit([42], [9, 9, 9, 9]) == []  # same hash, other tokens: a miss
    assert pool.longest_hit([42], [1, 2, 3, 4]) == [block]
    assert pool.register(pool.allocate(), 42, [1, 2, 3, 4]) is False  # one cached copy per prefix


def test_prompt_logprob_requests_and_a_disabled_cache_reuse_nothing():
    kv = KVBlocks(num_blocks=16, block_size=B)
    run(kv, list(range(9)))
    skipped = seq(list(range(9)))
    assert kv.admit(skipped, use_cache=False) and skipped.num_computed == 0
    assert kv.num_queried_tokens == 9  # not counted as a query
    off = KVBlocks(num_blocks=16, block_size=B, caching=False, events=Recorder())
    run(off, list(range(9)))
    again = seq(list(range(9)))
    assert off.admit(again) and again.num_computed == 0
    assert off.num_queried_tokens == 0 and off.pool.num_cached_blocks == 0 and off.pool.events is None


def test_admission_reserves_what_a_sequence_may_grow_into_and_release_returns_it():
    kv = KVBlocks(num_blocks=8, block_size=B)
    s = seq(list(range(6)), max_tokens=10)  # up to 16 tokens: 4 blocks
    assert kv.admit(s) and kv.reserved == 4 and kv.num_available_blocks == 4
    kv.grow(s, 6)
    assert kv.reserved == 2 and kv.num_free_blocks == 6
    assert kv.admit(seq(list(range(50, 70)), max_tokens=1)) is False  # 21 tokens: 6 blocks > 4 available
    with pytest.raises(RuntimeError, match="grew past"):
        kv.grow(s, 17)
    kv.release(s)
    assert kv.reserved == 0 and kv.num_free_blocks == 8
    capped = seq(list(range(6)), max_tokens=1000, max_len=20)  # the context caps the reservation
    assert kv.admit(capped) and kv.reserved == 5


def test_a_pool_of_no_blocks_and_a_bad_block_size_are_refused():
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(num_blocks=0, block_size=B)
    with pytest.raises(ValueError, match="block size"):
        BlockPool(num_blocks=1, block_size=0)
    pool = BlockPool(num_blocks=1, block_size=B)
    pool.allocate()
    with pytest.raises(RuntimeError, match="no free KV block"):
        pool.allocate()


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
def test_greedy_output_is_identical_with_the_block_cache_on_and_off(tiny_model, kernels):
    from tandem.engine import Engine, EngineConfig, SamplingParams

    params = [SamplingParams.greedy_params(4 + 3 * (i % 4), ignore_eos=True) for i in range(len(REQUESTS))]
    runs = {}
    for caching in (False, True):
        # Three sequences at a time for twelve requests, in a pool of 36 blocks of 8: cached blocks are
        # evicted again and again, and a 20-token prefill budget splits prompts, so chunks after a
        # cached prefix attend to shared keys.
        config = EngineConfig(
            max_model_len=96, kv_cache_tokens=96 * 3, max_prefill_tokens=20, enable_prefix_caching=caching,
            prefix_block_size=8,
        )  # fmt: skip
        engine = Engine(tiny_model, config)
        engine.runner.kernels = engine.runner.kernels and kernels
        shared = []
        schedule = engine.batcher.schedule

        def spy(schedule=schedule, shared=shared, engine=engine):
            plan = schedule()
            tables = [b for s in engine.batcher.running for b in set(s.block_table)]
            shared.append(len(tables) - len(set(tables)))  # blocks read by more than one running sequence
            return plan

        engine.batcher.schedule = spy
        runs[caching] = run_staggered(engine, [FAMILIES[f] + tail for f, tail in REQUESTS], params), engine, shared
    (off, engine_off, shared_off), (on, engine_on, shared_on) = runs[False], runs[True]
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert engine_on.prefix_cache_hits >= 6 * 40  # most requests reused their family's 40-token prefix
    assert engine_on.prefix_cache_queries == sum(len(FAMILIES[f]) + len(t) for f, t in REQUESTS)
    assert engine_on.batcher.kv.num_evicted_blocks > 0 and max(shared_on) > 0 and max(shared_off) == 0
    assert sum(o.num_cached_tokens for o in on) == engine_on.prefix_cache_hits
    assert engine_on.num_prompt_tokens == engine_off.num_prompt_tokens - engine_on.prefix_cache_hits
    assert engine_off.prefix_cache_hits == engine_off.prefix_cache_queries == 0
    for engine in (engine_on, engine_off):  # everything handed back
        assert engine.batcher.kv.num_free_blocks == engine.batcher.kv.pool.num_blocks and engine.kv_used == 0.0


def simulated_hit_rate(prompts: int, num_blocks: int, concurrent: int, requests: int = 400, seed: int = 0) -> float:
    """Closed-loop traffic on one replica's block cache alone: `concurrent` sequences at a time, each
    a random one of `prompts` 400-token system prompts plus its own tail, running 5 steps."""
    import random

    rng = random.Random(seed)
    systems = [[1000 * p + i for i in range(400)] for p in range(prompts)]
    kv = KVBlocks(num_blocks=num_blocks, block_size=16)
    running = []  # (steps left, sequence)
    for r in range(requests):
        while len(running) >= concurrent:
            running = [(left - 1, s) for left, s in running]
            for _, s in [item for item in running if item[0] == 0]:
                kv.release(s)
            running = [item for item in running if item[0] > 0]
        s = seq([*rng.choice(systems), 900_000 + r, 7, 8], max_tokens=1, max_len=512)
        assert kv.admit(s)
        computed(kv, s)
        running.append((5, s))
    return kv.num_hit_tokens / kv.num_queried_tokens


def test_a_replica_that_sees_fewer_distinct_prompts_hits_more():
    """What prefix-aware routing buys: half the prompts per replica, many more hits (a pool of 120
    blocks holds four 25-block system prompts beside the running sequences, not eight)."""
    sticky, spread = simulated_hit_rate(4, 120, 3), simulated_hit_rate(8, 120, 3)
    assert sticky > 0.85 and spread < 0.7, (sticky, spread)


# The draft-model recipes (their own per-slot draft cache beside the target's blocks) are checked
# against the target alone, with the block cache on, in tests/optimize/test_speculative.py.
@pytest.mark.parametrize("recipe", ["ngram(k=3)"])
def test_speculative_greedy_output_is_identical_with_the_block_cache_on_and_off(tiny_llama_dir, tiny_draft_dir, recipe):
    """Verification rows write k + 1 positions past a shared prefix and read it through the block
    table: the same tokens as without the cache."""
    from tandem.engine import Engine, EngineConfig, SamplingParams
    from tandem.model import load_model
    from tandem.optimize import apply_recipe

    prompts = [FAMILIES[f] + tail + tail for f, tail in REQUESTS[:6]]  # repeated tails: n-grams to find
    params = [SamplingParams.greedy_params(10, ignore_eos=True)] * len(prompts)
    runs = []
    for caching in (False, True):
        optimized = apply_recipe(load_model(tiny_llama_dir), recipe)
        config = EngineConfig(
            max_model_len=128, kv_cache_tokens=128 * 3, max_prefill_tokens=24, enable_prefix_caching=caching,
            prefix_block_size=8,
        )  # fmt: skip
        engine = Engine(optimized, config)
        runs.append(([o.token_ids for o in run_staggered(engine, prompts, params)], engine))
    (off, _), (on, engine_on) = runs
    assert on == off
    assert engine_on.prefix_cache_hits > 0 and engine_on.num_drafted_tokens > 0
