"""What both apps do around uvicorn: one logging setup, one uvicorn configuration, and a server that
exits 0 after SIGTERM.

`uvicorn_config(app, settings)` is how both apps run: uvicorn's h11 protocol under a
`ConnectionGuard` (a cap on open connections, a deadline for headers), uvicorn's own keep-alive
timeout, listen backlog and header-size limit from the settings, and uvicorn's log records going
through the one logging setup (`configure_logging`), whose handler rate-limits repeats.

uvicorn re-raises SIGTERM/SIGINT after a graceful shutdown, so the process would end "killed by
SIGTERM" (and a second Ctrl-C mid-shutdown prints a KeyboardInterrupt traceback). `ExitZeroServer`
routes both signals to `handle_exit` instead: the first starts the graceful shutdown, a second one
forces it, and the process exits with the code the app chose.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Generator
from typing import Any

import uvicorn

from tandem.edge.connections import ConnectionGuard, descriptor_budget
from tandem.edge.logs import RateLimitFilter
from tandem.edge.settings import Settings

__all__ = ["ExitZeroServer", "configure_logging", "uvicorn_config"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RateLimitFilter) for f in handler.filters):
            handler.addFilter(RateLimitFilter())
    logging.getLogger("tandem").setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per probe and per proxied request


def uvicorn_config(
    app: Any, settings: Settings, *, shutdown_timeout_s: float, per_connection_fds: int = 1
) -> uvicorn.Config:
    """uvicorn for `app` with the connection settings (see tandem.edge.connections for what is whose).

    `per_connection_fds`: descriptors a client connection costs (the gateway also opens one to a
    replica), so the connection cap stays under the process's descriptor limit.
    """
    cap = descriptor_budget(settings.max_connections, per_connection_fds)
    if cap < settings.max_connections:
        logging.getLogger("tandem.http").warning(
            "max_connections %d is over what this process's file descriptors allow; using %d",
            settings.max_connections, cap,
        )  # fmt: skip
    guard = ConnectionGuard(cap, settings.header_timeout, max_header_bytes=settings.max_header_bytes)
    return uvicorn.Config(
        app, host=settings.host, port=settings.port, http=guard.protocol, log_config=None,
        log_level=settings.log_level, access_log=settings.access_log, server_header=False,
        timeout_keep_alive=settings.keep_alive_timeout, h11_max_incomplete_event_size=settings.max_header_bytes,
        backlog=settings.backlog, timeout_graceful_shutdown=shutdown_timeout_s,
    )  # fmt: skip


class ExitZeroServer(uvicorn.Server):
    """uvicorn that exits 0 after a clean shutdown on SIGTERM/SIGINT, and without a traceback on a second."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)
