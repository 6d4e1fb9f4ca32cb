"""Logs that a flood cannot flood: the same message at most a few times per interval, then a count.

A connection flood makes uvicorn log "Invalid HTTP request received." per bad request and asyncio
log "socket.accept() out of system resource" per failed accept (about 8 MB/s in one probe). The
`RateLimitFilter` on the log handler lets `burst` warnings (or worse) of one kind (logger, level,
message template) through per `interval_s`, drops the rest, and adds "(N similar messages
suppressed)" to the next one that passes. Info and debug lines (an access log, replicas starting)
pass untouched. The clock is passed in, so tests need no sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RateLimitFilter"]


class RateLimitFilter(logging.Filter):
    def __init__(self, burst: int = 10, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst, self.interval_s, self.clock = burst, interval_s, clock
        self._windows: dict[tuple[str, int, str], list[float | int]] = {}  # kind -> [window start, passed, dropped]
        self._lock = threading.Lock()  # handlers are called from any thread

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        kind = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            window = self._windows.get(kind)
            if window is None or now - window[0] >= self.interval_s:
                dropped = int(window[2]) if window is not None else 0
                self._windows[kind] = [now, 1, 0]
                if len(self._windows) > 1000:  # many kinds (messages built without a template): forget old ones
                    self._windows = {k: w for k, w in self._windows.items() if now - w[0] < self.interval_s}
                if dropped:
                    suppressed = f"{dropped} similar messages suppressed in the last {self.interval_s:g} s"
                    record.msg = f"{record.msg} ({suppressed})"
                return True
            if window[1] < self.burst:
                window[1] += 1
                return True
            window[2] += 1
            return False
