"""KVEventLog: numbered stored/removed events, net changes since a reader's position, resets for gaps
and for positions from another life (a restart)."""

import threading

import pytest

from tandem.engine.kv_event_log import KVEventLog


def test_a_reader_gets_the_net_change_since_its_position():
    log = KVEventLog(block_size=16, hash_seed=3, first_seq=1000)
    first = log.since(0)  # a new reader: everything held (nothing yet), as a reset
    assert (first.seq, first.reset, first.stored, first.removed) == (1000, True, (), ())
    log.stored(1)
    log.stored(2)
    log.stored(3)
    delta = log.since(1000)
    assert (delta.seq, delta.reset, delta.stored, delta.removed) == (1003, False, (1, 2, 3), ())
    assert (delta.block_size, delta.hash_seed) == (16, 3)
    log.removed(2)
    log.stored(4)
    log.removed(4)  # stored and removed inside the window: reported removed
    log.stored(2)  # removed and stored again: reported stored
    delta = log.since(1003)
    assert (delta.seq, delta.reset, set(delta.stored), set(delta.removed)) == (1007, False, {2}, {4})
    assert log.since(1007).stored == log.since(1007).removed == () and not log.since(1007).reset


def test_a_gap_older_than_the_log_keeps_is_a_reset_with_everything_held():
    log = KVEventLog(block_size=16, capacity=4, first_seq=0)
    for h in range(1, 7):
        log.stored(h)
    log.removed(1)
    kept = log.since(3)  # events 4..7 are the four kept
    assert not kept.reset and set(kept.stored) == {4, 5, 6} and kept.removed == (1,)
    gap = log.since(2)
    assert gap.reset and set(gap.stored) == {2, 3, 4, 5, 6} and gap.removed == ()


def test_a_position_from_before_a_restart_reads_as_a_reset():
    old = KVEventLog(block_size=16, first_seq=1_000)
    old.stored(7)
    seen = old.since(0).seq
    restarted = KVEventLog(block_size=16, first_seq=2_000)  # numbers start at the (later) start time
    restarted.stored(8)
    answer = restarted.since(seen)
    assert answer.reset and answer.stored == (8,)
    ahead = KVEventLog(block_size=16, first_seq=0)  # a position the log never reached: also a reset
    assert ahead.since(50).reset


def test_recording_and_reading_from_two_threads_loses_nothing():
    log = KVEventLog(block_size=16, capacity=100_000)
    threads = [threading.Thread(target=lambda k=k: [log.stored(k * 10_000 + i) for i in range(2000)]) for k in range(2)]
    for t in threads:
        t.start()
    answers = [log.since(0) for _ in range(50)]
    for t in threads:
        t.join()
    assert log.seq == 4000 and len(log.since(0).stored) == 4000
    assert all(len(a.stored) <= a.seq for a in answers)


def test_capacity_must_hold_an_event():
    with pytest.raises(ValueError, match="at least one event"):
        KVEventLog(block_size=16, capacity=0)
