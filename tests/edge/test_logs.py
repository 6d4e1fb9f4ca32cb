"""A flood of one warning is cut to a few lines per interval, then counted."""

from __future__ import annotations

import logging

from tandem.edge.logs import RateLimitFilter


def record(msg: str, level: int = logging.WARNING, name: str = "uvicorn.error") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, None, None)


def test_repeats_pass_up_to_the_burst_then_are_counted_on_the_next_that_passes():
    now = [0.0]
    limit = RateLimitFilter(burst=3, interval_s=10.0, clock=lambda: now[0])
    passed = [limit.filter(record("Invalid HTTP request received.")) for _ in range(1000)]
    assert sum(passed) == 3
    now[0] = 10.0
    later = record("Invalid HTTP request received.")
    assert limit.filter(later) and "(997 similar messages suppressed in the last 10 s)" in later.getMessage()


def test_other_kinds_and_info_lines_are_not_limited():
    limit = RateLimitFilter(burst=1, interval_s=10.0, clock=lambda: 0.0)
    assert limit.filter(record("a")) and not limit.filter(record("a"))
    assert limit.filter(record("b")) and limit.filter(record("a", name="asyncio"))
    assert all(limit.filter(record("GET /v1/models 200", level=logging.INFO)) for _ in range(100))
