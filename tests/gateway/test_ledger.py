"""The usage ledger on SQLite: batched writes off the caller's thread, sums per period, WAL mode.
The same on a real PostgreSQL server: tests/gateway/test_ledger_postgres.py."""

import sqlite3
import time

import pytest

from tandem.gateway.ledger import Ledger, LedgerError, UsageRecord, ledger_url
from tandem.gateway.usage import IDLE, ReplicaTime
from tandem.schedule.variant import Variant

DAY = 1_800_000_000 // 86400 * 86400


def test_records_are_summed_per_period_and_status(tmp_path):
    ledger = Ledger(tmp_path / "usage.db", flush_interval_s=0.05)
    for at, status in [(DAY + 10, 200), (DAY + 20, 200), (DAY + 3700, 429), (DAY + 86400 + 5, 200)]:
        ledger.record(UsageRecord(at, "a", "tiny", "fast", status, 1, 10, 5 if status == 200 else 0))
    ledger.record(UsageRecord(DAY + 30, "a", "tiny", "fast", 0, replica_seconds=3.0, dollars=0.01))
    ledger.flush()
    days = ledger.query(group_by="day")
    assert [(r["period_start"], r["requests"], r["requests_by_status"]) for r in days] == [
        (DAY, 3, {"200": 2, "429": 1}), (DAY + 86400, 1, {"200": 1})
    ]  # fmt: skip
    assert days[0]["prompt_tokens"] == 30 and days[0]["completion_tokens"] == 10
    assert days[0]["replica_seconds"] == 3.0 and days[0]["dollars"] == pytest.approx(0.01)
    assert len(ledger.query(group_by="hour", since=DAY, until=DAY + 86400)) == 2
    assert ledger.query(tenant="b") == []
    assert ledger.totals_since(DAY + 86400) == [("a", 15, 0.0)]
    ledger.close()
    assert sqlite3.connect(tmp_path / "usage.db").execute("PRAGMA journal_mode").fetchone() == ("wal",)
    reopened = Ledger(tmp_path / "usage.db")  # another process later: the same sums
    assert reopened.query(group_by="day") == days
    reopened.close()


def test_writes_never_block_the_caller_and_land_within_the_flush_interval(tmp_path):
    ledger = Ledger(tmp_path / "usage.db", flush_interval_s=0.2)
    started = time.perf_counter()
    for i in range(2000):
        ledger.record(UsageRecord(DAY + i, "a", "m", "v", 200, 1, 1, 1))
    queued_s = time.perf_counter() - started
    other = Ledger(tmp_path / "usage.db")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sum(r["requests"] for r in other.query()) < 2000:
        time.sleep(0.05)
    assert sum(r["requests"] for r in other.query()) == 2000  # committed without flush(), by the writer thread
    assert queued_s < 1.0, queued_s
    ledger.close()
    other.close()


def test_urls_name_sqlite_files_or_postgresql():
    assert ledger_url("/x/u.db") == "sqlite:////x/u.db"
    assert ledger_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    with pytest.raises(LedgerError, match="postgresql"):
        ledger_url("mysql://h/db")


def test_replica_time_is_split_by_tokens_and_idle_time_is_billed_apart():
    time_of = ReplicaTime()
    fast = Variant("fast", "baseline", usd_per_hour=3.6)
    assert time_of.settle(0.0, {"http://r1": fast}) == []  # first sight: no time yet
    time_of.add("http://r1", "a", "tiny", "fast", 300)
    time_of.add("http://r1", "b", "tiny", "fast", 100)
    records = {r.tenant: r for r in time_of.settle(2.0, {"http://r1": fast})}
    assert records["a"].replica_seconds == 1.5 and records["b"].replica_seconds == 0.5
    assert records["a"].dollars == pytest.approx(1.5 * 3.6 / 3600)
    (idle,) = time_of.settle(3.0, {"http://r1": fast})
    assert idle.tenant == IDLE and idle.replica_seconds == 1.0


CHILD = """
import sys, time
from tandem.gateway.ledger import Ledger, UsageRecord
ledger = Ledger(sys.argv[1])
n = 0
while True:
    ledger.record(UsageRecord(time.time(), "a", "m", "v", 200, 1, 1, 1))
    n += 1
    print(n, flush=True)
    time.sleep(0.005)
"""


def test_a_process_killed_with_sigkill_loses_at_most_the_last_second(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "usage.db")], stdout=subprocess.PIPE, text=True, env=env
    )
    seen = [(time.monotonic(), int(child.stdout.readline()))]  # (when, how many recorded by then), once it runs
    started = time.monotonic()
    while time.monotonic() - started < 3.0:
        line = child.stdout.readline()
        if line:
            seen.append((time.monotonic(), int(line)))
    os.kill(child.pid, signal.SIGKILL)
    killed = time.monotonic()
    child.wait(10)
    ledger = Ledger(tmp_path / "usage.db")
    stored = sum(r["requests"] for r in ledger.query())
    ledger.close()
    a_second_before = max(n for at, n in seen if at <= killed - 1.0)
    assert a_second_before <= stored <= seen[-1][1] + 1, (a_second_before, stored, seen[-1])
