"""A replica's lifeline to the gateway that started it: when the gateway is gone, the replica goes too.

A gateway killed with SIGKILL cannot stop its replicas, and they run in their own sessions (so a
terminal's Ctrl-C reaches only the gateway). Linux's PR_SET_PDEATHSIG would fire when the *thread*
that forked the child exits, and the gateway starts replicas from worker threads, so a replica
watches instead: a daemon thread compares os.getppid() with the gateway's pid and, once the
replica has been re-parented, calls `on_orphaned` (the server: SIGTERM itself, then exit hard).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

__all__ = ["watch_parent", "orphaned"]

logger = logging.getLogger("tandem.serve")


def orphaned(parent_pid: int, getppid: Callable[[], int] = os.getppid) -> bool:
    return getppid() != parent_pid


def watch_parent(
    parent_pid: int,
    on_orphaned: Callable[[], None],
    *,
    interval_s: float = 0.5,
    getppid: Callable[[], int] = os.getppid,
    stop: threading.Event | None = None,
) -> threading.Thread:
    """Start a daemon thread that calls `on_orphaned()` once, as soon as `parent_pid` is no longer the parent."""
    stop = stop or threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if orphaned(parent_pid, getppid):
                logger.warning("the gateway (pid %d) is gone; shutting down", parent_pid)
                on_orphaned()
                return
            stop.wait(interval_s)

    thread = threading.Thread(target=watch, name="tandem-lifeline", daemon=True)
    thread.start()
    return thread
