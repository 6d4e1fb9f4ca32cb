"""What both apps do around uvicorn: one logging setup, and a server that exits 0 after SIGTERM.

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

import uvicorn

__all__ = ["ExitZeroServer", "configure_logging"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    logging.getLogger("tandem").setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per probe and per proxied request


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
