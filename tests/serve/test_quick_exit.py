"""exit_now ends the process with the code given, after what a normal exit would do first: the atexit
handlers run, the log handlers and stdout/stderr are flushed (nothing written is lost)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, logging, sys
from tandem.serve.quick_exit import exit_now
logging.basicConfig(stream=sys.stderr, format="%(message)s")
atexit.register(lambda: print("atexit ran", end=""))
sys.stdout.write("unflushed ")
logging.getLogger("x").warning("logged")
exit_now(3)
raise SystemExit("never reached")
"""


def test_exit_now_runs_atexit_flushes_and_ends_with_the_code():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushed atexit ran"
    assert done.stderr.strip() == "logged"
