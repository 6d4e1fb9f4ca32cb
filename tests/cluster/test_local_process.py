"""LocalBackend with its real spawner, port finder and probe, around a stand-in server process.

The stand-in is a few lines of http.server answering GET /ready (the `tandem serve` test comes
with the gateway); it checks the parts that touch the OS: Popen in its own session, a free
loopback port, the httpx probe, SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import time

from tandem.cluster import LocalBackend, ReplicaSpec, ReplicaState
from tandem.cluster.local import popen_spawner

STAND_IN = """
import http.server, sys
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/ready" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
"""


def stand_in(spec: ReplicaSpec, port: int, host: str, replica_id: str, parent_pid: int | None = None) -> list[str]:
    return [sys.executable, "-c", STAND_IN, str(port)]


def failing(spec: ReplicaSpec, port: int, host: str, replica_id: str, parent_pid: int | None = None) -> list[str]:
    code = "import sys; print('loading'); print('Error: no such recipe', file=sys.stderr); sys.exit(3)"
    return [sys.executable, "-c", code]


def test_a_real_process_becomes_ready_and_stops_on_sigterm(tmp_path):
    backend = LocalBackend(spawn=popen_spawner(tmp_path), command=stand_in, kill_after_s=10.0)
    replica = backend.start(ReplicaSpec(variant="v", recipe="baseline"))
    try:
        deadline = time.monotonic() + 30.0
        while not backend.health(replica.replica_id):
            assert time.monotonic() < deadline, "the stand-in server never answered /ready"
            time.sleep(0.05)
        assert backend.list()[0].state is ReplicaState.READY
    finally:
        backend.stop(replica.replica_id)
    deadline = time.monotonic() + 30.0
    while backend.stopping:
        assert time.monotonic() < deadline, "the stand-in ignored SIGTERM"
        time.sleep(0.05)
    assert backend.exited[-1].exit_code == -signal.SIGTERM  # the stand-in has no handler: SIGTERM ended it
    assert (tmp_path / f"{replica.replica_id}.log").exists()


def test_a_process_that_fails_is_reported_with_the_end_of_its_output(tmp_path):
    backend = LocalBackend(spawn=popen_spawner(tmp_path), command=failing)
    replica = backend.start(ReplicaSpec(variant="v", recipe="nope"))
    deadline = time.monotonic() + 30.0
    while not (exits := backend.exits()):
        assert time.monotonic() < deadline, "the failing process never exited"
        time.sleep(0.05)
    (ended,) = exits
    assert ended.replica.replica_id == replica.replica_id and not ended.expected and ended.code == 3
    assert ended.error == "Error: no such recipe" and "loading" in ended.output
    assert "Error: no such recipe" in (tmp_path / f"{replica.replica_id}.log").read_text()
