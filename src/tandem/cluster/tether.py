"""`python -m tandem.cluster.tether --parent-pid P -- PROGRAM ARGS...`: run an external engine on a tether.

A tandem replica watches the gateway that started it (tandem.edge.lifeline) and leaves when it is
gone; vLLM or llama.cpp's server cannot. The tether does it for them, standard library only: it
starts the server (in the same process group, with PR_SET_PDEATHSIG so a SIGKILLed tether takes
the server with it), passes on SIGTERM and SIGINT (the server drains and exits as it would), and
when the parent pid is no longer its parent, sends the server SIGTERM, then SIGKILL after
`--grace-s`. It exits as the server did (with its status, or of the same signal).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

__all__ = ["main"]

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the tether's own watch still stops it
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tandem.cluster.tether", description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--grace-s", type=float, default=30.0, help="SIGTERM to SIGKILL once the parent is gone")
    parser.add_argument("--interval-s", type=float, default=0.5)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    try:
        child = subprocess.Popen(command, preexec_fn=_die_with_parent)  # noqa: PLW1509 (single-threaded here)
    except OSError as exc:
        print(f"Error: cannot start {command[0]}: {exc}", file=sys.stderr, flush=True)
        return 127

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    kill_at: float | None = None
    while (code := child.poll()) is None:
        if kill_at is None and os.getppid() != args.parent_pid:
            print(f"tether: pid {args.parent_pid} is gone; stopping {command[0]}", file=sys.stderr, flush=True)
            child.terminate()
            kill_at = time.monotonic() + args.grace_s
        elif kill_at is not None and time.monotonic() >= kill_at:
            child.kill()
        try:
            child.wait(timeout=args.interval_s)
        except subprocess.TimeoutExpired:
            pass
    if code < 0:  # die of the same signal, so the backend sees what the server saw (-15: SIGTERM)
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
