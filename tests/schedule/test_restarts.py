"""Restart backoff: doubling waits after startup failures, reset by a ready replica; giving up."""

from __future__ import annotations

from tandem.schedule import restarts
from tandem.schedule.restarts import StartHistory


def test_each_failure_in_a_row_doubles_the_wait_up_to_the_cap():
    history, waits = StartHistory(), []
    for now in (0.0, 10.0, 20.0, 30.0, 40.0):
        history = restarts.start_failed(history, now, "boom", backoff_s=1.0, backoff_max_s=5.0)
        waits.append(history.retry_at - now)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert not restarts.may_start(history, 44.9) and restarts.may_start(history, 45.0)
    assert history.restarts == 5 and history.last_error == "boom"


def test_a_ready_replica_resets_the_count_and_a_variant_that_served_never_gives_up():
    history = StartHistory()
    for now in (0.0, 1.0):
        history = restarts.start_failed(history, now, "boom", 1.0, 60.0)
    assert not restarts.gave_up(history, attempts=3)
    history = restarts.start_failed(history, 3.0, "boom", 1.0, 60.0)
    assert restarts.gave_up(history, attempts=3)
    ready = restarts.became_ready(history)
    assert ready.failures == 0 and restarts.may_start(ready, 3.0) and ready.ever_ready
    for now in (10.0, 20.0, 30.0):
        ready = restarts.start_failed(ready, now, "boom", 1.0, 60.0)
    assert not restarts.gave_up(ready, attempts=3)
    crashed = restarts.crashed(ready, "killed")
    assert crashed.restarts == ready.restarts + 1 and crashed.failures == ready.failures
