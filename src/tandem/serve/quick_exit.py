"""exit_now: a replica's process ends as soon as its clean shutdown is done.

After `run_server` returns (uvicorn stopped, the engine shut down, in-flight requests answered), a
normal interpreter exit still spends seconds tearing down torch and the loaded model (about 3 s on an
idle 2-core machine, 10 s on a busy one) before the process is gone. The gateway waits for that exit
before it counts a drained replica's memory as free or a replaced replica as stopped, so those seconds
delay every rollout, scale-down and restart. Here the atexit handlers and logging are run and stdout
and stderr flushed, as a normal exit would, and then the process ends without the teardown.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

__all__ = ["exit_now"]


def exit_now(code: int) -> None:
    """End the process with `code`: atexit handlers, logging and stdio flushed, no interpreter teardown."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or gone: nothing more can be written anyway
                pass
    finally:
        os._exit(code)
