"""The tether, with real processes: an external engine leaves with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# A stand-in server: writes its pid, says how it ended (SIGTERM: "term", exit 0), else sleeps.
CHILD = """
import os, signal, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
def term(*_):
    open(sys.argv[1] + ".end", "w").write("term")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
while True:
    time.sleep(0.05)
"""


def tether(tmp_path, parent_pid: int | None = None, child: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    pidfile = str(tmp_path / "child.pid")
    command = child or [sys.executable, "-c", CHILD, pidfile]
    argv = [sys.executable, "-m", "tandem.cluster.tether", "--parent-pid", str(parent_pid or os.getpid()),
            "--interval-s", "0.05", "--grace-s", "5", "--", *command]  # fmt: skip
    return subprocess.Popen(argv), pidfile


def wait(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is not alive
        return stat.read().split(")")[-1].split()[0] != "Z"


def child_pid(pidfile: str) -> int:
    assert wait(lambda: os.path.exists(pidfile) and open(pidfile).read())
    return int(open(pidfile).read())


def test_sigterm_is_passed_on_and_the_tether_exits_as_the_server_did(tmp_path):
    proc, pidfile = tether(tmp_path)
    pid = child_pid(pidfile)
    proc.terminate()
    assert proc.wait(20) == 0
    assert open(pidfile + ".end").read() == "term" and not alive(pid)


# A gateway that starts a tethered server, sees it serving, and dies without stopping it.
GATEWAY = """
import os, subprocess, sys, time
pidfile = sys.argv[1]
subprocess.Popen([sys.executable, "-m", "tandem.cluster.tether", "--parent-pid", str(os.getpid()),
                  "--interval-s", "0.05", "--", sys.executable, "-c", sys.argv[2], pidfile])
while not (os.path.exists(pidfile) and open(pidfile).read()):
    time.sleep(0.05)
time.sleep(0.3)  # the server's SIGTERM handler is in place
"""


def test_the_server_is_stopped_once_its_parent_is_gone(tmp_path):
    pidfile = str(tmp_path / "child.pid")
    subprocess.run([sys.executable, "-c", GATEWAY, pidfile, CHILD], timeout=60, check=True)
    pid = child_pid(pidfile)
    assert wait(lambda: not alive(pid)), "the server outlived the gateway"
    assert open(pidfile + ".end").read() == "term"  # asked to stop (SIGTERM), not killed


def test_a_sigkilled_tether_takes_the_server_with_it(tmp_path):
    proc, pidfile = tether(tmp_path)
    pid = child_pid(pidfile)
    proc.kill()
    proc.wait(20)
    assert wait(lambda: not alive(pid)), "the server outlived its SIGKILLed tether"


def test_a_server_killed_by_a_signal_is_reported_as_that_signal(tmp_path):
    proc, pidfile = tether(tmp_path, child=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"])
    assert proc.wait(20) == -signal.SIGKILL


def test_a_program_that_cannot_start_exits_127(tmp_path):
    proc, _ = tether(tmp_path, child=[str(tmp_path / "no-such-engine")])
    assert proc.wait(20) == 127
