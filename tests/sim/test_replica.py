"""The simulated replica: iteration-level batching at a Profile's speeds, timed exactly between events."""

from __future__ import annotations

import pytest

from tandem.contracts import Profile
from tandem.sim.replica import SimReplica, SimSequence


def profile(decode=None, prefill=1000.0, slots=8, kv_cache_tokens=0) -> Profile:
    return Profile(
        recipe="r", hardware="h", model="m", weight_bytes=1, kv_bytes_per_token=1, max_slots=slots,
        decode_tokens_per_s=decode or {1: 50.0, 2: 100.0, 8: 400.0}, prefill_tokens_per_s=prefill,
        ttft_s_p50=0.1, cold_start_s=1.0, max_model_len=4096, kv_cache_tokens=kv_cache_tokens,
    )  # fmt: skip


def run(replica: SimReplica, until: float, dt: float = 0.5) -> list[SimSequence]:
    done, now = [], 0.0
    while now < until:
        done += replica.step(now, dt)
        now += dt
    return done


def test_one_request_prefills_then_decodes_at_the_profile_speed():
    replica = SimReplica("r", profile())
    seq = SimSequence(arrival_s=0.1, prompt_tokens=100, output_tokens=11)
    replica.submit(seq, now=0.0)  # dispatched at the step's start, reaches the replica at its arrival
    assert run(replica, 1.0) == [seq]
    assert seq.first_token_s == pytest.approx(0.2)  # 100 prompt tokens at 1000/s, from its arrival at 0.1
    assert seq.ttft_s == pytest.approx(0.1)
    assert seq.finished_s == pytest.approx(0.4)  # 10 more tokens at 50/s
    assert seq.tpot_s == pytest.approx(0.02)
    assert replica.busy == 0 and replica.kv_used == 0


def test_a_prompt_prefilled_beside_a_decoding_sequence_delays_it_by_its_prefill_time():
    alone = SimReplica("a", profile())
    first = SimSequence(0.0, prompt_tokens=10, output_tokens=21)
    alone.submit(first, 0.0)
    run(alone, 2.0)
    shared = SimReplica("b", profile())
    a, b = SimSequence(0.0, 10, 21), SimSequence(0.1, 512, 5)
    shared.submit(a, 0.0)
    shared.submit(b, 0.0)
    run(shared, 2.0)
    assert first.finished_s == pytest.approx(0.41)
    assert a.finished_s == pytest.approx(0.41 + 0.512)  # one iteration of 512 prompt tokens at 1000/s
    assert b.first_token_s == pytest.approx(0.1 + 0.512 + 0.02)  # its chunk shares the iteration with a's row


def test_requests_wait_first_come_first_served_for_a_slot():
    replica = SimReplica("r", profile(slots=1))
    first, second = SimSequence(0.0, 10, 11), SimSequence(0.0, 10, 11)
    replica.submit(first, 0.0)
    replica.submit(second, 0.0)
    run(replica, 1.0)
    assert first.finished_s == pytest.approx(0.21)
    assert second.first_token_s == pytest.approx(0.22) and second.ttft_s == pytest.approx(0.22)


def test_a_paged_kv_budget_admits_only_what_fits():
    replica = SimReplica("r", profile(kv_cache_tokens=1000))
    seqs = [SimSequence(0.0, 300, 100) for _ in range(3)]  # 400 tokens each: two fit in 1000
    for seq in seqs:
        replica.submit(seq, 0.0)
    replica.step(0.0, 0.01)
    assert replica.running == 2 and len(replica.waiting) == 1 and replica.kv_used == 800
    run(replica, 10.0)
    assert all(s.finished_s is not None for s in seqs)
    assert seqs[2].first_token_s > min(seqs[0].finished_s, seqs[1].finished_s)
    assert replica.kv_used == 0


def test_a_request_larger_than_the_kv_budget_still_runs_alone():
    replica = SimReplica("r", profile(kv_cache_tokens=100))
    seq = SimSequence(0.0, 300, 10)
    replica.submit(seq, 0.0)
    run(replica, 2.0)
    assert seq.finished_s is not None


def test_in_flight_lists_every_sequence_on_the_replica():
    replica = SimReplica("r", profile(slots=1))
    seqs = [SimSequence(0.0, 100, 50) for _ in range(3)]
    for seq in seqs:
        replica.submit(seq, 0.0)
    replica.step(0.0, 0.5)
    assert {id(s) for s in replica.in_flight()} == {id(s) for s in seqs}


def test_a_profile_without_decode_rates_is_refused():
    with pytest.raises(ValueError, match="decode rates"):
        SimReplica("r", profile(decode={1: 0.0}))
