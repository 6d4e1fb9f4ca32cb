"""The gateway's KV index: events in order, resets, gaps and restarts, and prompt matching."""

from __future__ import annotations

from tandem.contracts import KVEvents, kv_block_hashes
from tandem.gateway.kv_index import KVIndex

PROMPT = list(range(40))  # 10 blocks of 4
CHAIN = kv_block_hashes(PROMPT, 4, 7)


def events(seq: int, stored=(), removed=(), reset=False, block_size=4, seed=7) -> KVEvents:
    return KVEvents(seq, block_size, seed, reset, tuple(stored), tuple(removed))


def test_a_replica_holds_the_leading_run_of_the_prompts_blocks():
    index = KVIndex()
    assert index.apply("a", events(3, CHAIN[:6]), since=0)
    assert index.apply("b", events(1, [CHAIN[0], CHAIN[2]]), since=0)  # a hole after the first block
    match = index.match(PROMPT + [1, 2])  # a partial last block never counts
    assert match.prompt_tokens == 42
    assert dict(match.cached_tokens) == {"a": 24, "b": 4}
    assert match.publishing == frozenset({"a", "b"})
    assert index.match(PROMPT, ["b", "c"]).cached_tokens == {"b": 4}  # c publishes nothing


def test_events_apply_in_order_and_an_eviction_breaks_the_run():
    index = KVIndex()
    index.apply("a", events(2, CHAIN[:4]), since=0)
    assert index.since("a") == 2
    assert index.apply("a", events(5, CHAIN[4:8], removed=[CHAIN[1]]), since=2)
    assert index.match(PROMPT).cached_tokens == {"a": 4}
    assert index.blocks("a") == 7


def test_a_reset_replaces_what_was_known():
    index = KVIndex()
    index.apply("a", events(9, CHAIN), since=0)
    assert index.apply("a", events(12, CHAIN[:2], reset=True), since=9)
    assert index.match(PROMPT).cached_tokens == {"a": 8}
    assert index.since("a") == 12


def test_an_answer_that_cannot_follow_drops_the_replica_and_asks_for_a_resync():
    index = KVIndex()
    index.apply("a", events(9, CHAIN), since=0)
    assert not index.apply("a", events(4, CHAIN[:1]), since=9)  # its counter went back: a restart
    assert index.publishing() == [] and index.since("a") == 0
    index.apply("a", events(9, CHAIN), since=0)
    assert not index.apply("a", events(10, block_size=16), since=9)  # another block size
    assert index.publishing() == []
    assert not index.apply("a", events(10), since=3)  # asked from a position the index never had
    assert index.resyncs == 3


def test_replicas_hashed_with_another_scheme_are_matched_with_their_own_chain():
    index = KVIndex()
    index.apply("a", events(1, kv_block_hashes(PROMPT, 8, 0), block_size=8, seed=0), since=0)
    index.apply("b", events(1, CHAIN[:3]), since=0)
    assert index.match(PROMPT).cached_tokens == {"a": 40, "b": 12}
    assert index.scheme("a") == (8, 0) and index.scheme("c") is None


def test_keep_only_forgets_replicas_that_left():
    index = KVIndex()
    index.apply("a", events(1, CHAIN), since=0)
    index.apply("b", events(1, CHAIN), since=0)
    index.keep_only(["b"])
    assert index.publishing() == ["b"]


def test_a_routed_request_is_expected_on_its_replica_until_confirmed_or_expired():
    index = KVIndex(expect_ttl_s=10.0)
    index.apply("a", events(1, CHAIN[:2]), since=0)
    index.apply("b", events(1), since=0)
    index.expect("b", PROMPT, now=100.0)
    index.expect("c", PROMPT, now=100.0)  # publishes nothing: nothing expected
    assert index.match(PROMPT, now=105.0).cached_tokens == {"a": 8, "b": 40}
    assert index.match(PROMPT).cached_tokens == {"a": 8, "b": 0}  # without a time: what events said only
    assert index.match(PROMPT, now=110.0).cached_tokens["b"] == 0  # expired
    index.expect("b", PROMPT, now=200.0)
    index.apply("b", events(2, CHAIN[:3], removed=[CHAIN[3]]), since=1)  # confirmed 3, the 4th evicted
    assert index.match(PROMPT, now=201.0).cached_tokens["b"] == 12
    index.forget(["b"])
    index.apply("b", events(1), since=0)
    assert index.match(PROMPT, now=201.0).cached_tokens["b"] == 0
