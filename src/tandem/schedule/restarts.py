"""Restarts: when a variant may start another replica after some failed to start. Pure functions.

A replica that exits (or is stopped for not getting ready in time) before it ever became ready, or
whose start fails before any process exists, is a *startup failure*: a bad recipe, a model that
does not load, a port already taken, no free port in the range, a log file that cannot be opened. Starting the
next one at once would crash-loop, so each failure in a row doubles the wait before the next start
(`backoff_s`, 2x, 4x ... up to `backoff_max_s`); a replica that becomes ready resets the count. A
variant that never had a ready replica and failed `attempts` times in a row has *given up*: the
gateway exits if it is the primary (there is nothing to serve), a rollout to it is aborted.
A replica that dies after it was ready is replaced at once (and counted as a restart).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["StartHistory", "became_ready", "crashed", "gave_up", "may_start", "start_failed"]


@dataclass(frozen=True)
class StartHistory:
    """One variant's record of starting replicas."""

    failures: int = 0  # startup failures in a row (0 once a replica becomes ready)
    retry_at: float | None = None  # no new replica before this time
    ever_ready: bool = False
    restarts: int = 0  # replicas that ended without being asked to (ready or not)
    last_error: str = ""  # what the last of them said (its output's error line)


def start_failed(history: StartHistory, now: float, error: str, backoff_s: float, backoff_max_s: float) -> StartHistory:
    failures = history.failures + 1
    delay = min(backoff_max_s, backoff_s * 2 ** (failures - 1))
    return replace(history, failures=failures, retry_at=now + delay, restarts=history.restarts + 1, last_error=error)


def crashed(history: StartHistory, error: str) -> StartHistory:
    """A replica that had been ready died: replaced at once, counted as a restart."""
    return replace(history, restarts=history.restarts + 1, last_error=error)


def became_ready(history: StartHistory) -> StartHistory:
    return replace(history, failures=0, retry_at=None, ever_ready=True)


def may_start(history: StartHistory, now: float) -> bool:
    return history.retry_at is None or now >= history.retry_at


def gave_up(history: StartHistory, attempts: int) -> bool:
    return not history.ever_ready and history.failures >= attempts
