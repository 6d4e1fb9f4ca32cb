"""LocalBackend's logic with a fake process spawner, port finder, probe and clock (no real processes)."""

from __future__ import annotations

import sys

import pytest

from tandem.cluster import BackendError, LocalBackend, PortRange, ReplicaSpec, ReplicaState, serve_command
from tandem.cluster.local import log_file_name, popen_spawner


class FakeProcess:
    _pids = iter(range(1000, 2000))

    def __init__(self, argv, env) -> None:
        self.argv, self.env, self.pid = argv, env, next(self._pids)
        self.code: int | None = None
        self.signals: list[str] = []
        self.exit_on_term = True
        self.output = ""

    def output_tail(self) -> str:
        return self.output

    def poll(self):
        return self.code

    def terminate(self):
        self.signals.append("TERM")
        if self.exit_on_term:
            self.code = 0

    def kill(self):
        self.signals.append("KILL")
        self.code = -9


class World:
    """The fakes one LocalBackend is built from."""

    def __init__(self) -> None:
        self.now = 0.0
        self.processes: dict[str, FakeProcess] = {}
        self.ready_urls: set[str] = set()
        self.ports = iter(range(9001, 9100))
        self.taken_seen: list[set[int]] = []

    def port(self, taken) -> int:
        self.taken_seen.append(set(taken))
        return next(self.ports)

    def spawn(self, argv, env, replica_id):
        self.processes[replica_id] = FakeProcess(argv, env)
        return self.processes[replica_id]

    def backend(self, **kwargs) -> LocalBackend:
        return LocalBackend(
            spawn=self.spawn,
            ports=self.port,
            probe=lambda url: url in self.ready_urls,
            clock=lambda: self.now,
            base_env={"PATH": "/bin"},
            parent_pid=4242,
            **kwargs,
        )


SPEC = ReplicaSpec(variant="fast", recipe="int8+ngram", model="/models/tiny", threads=1, env=(("X", "1"),))


def test_serve_command():
    argv = serve_command(SPEC, 9001, python="py")
    assert argv == [
        "py", "-m", "tandem.cli", "serve", "--recipe", "int8+ngram", "--host", "127.0.0.1", "--port", "9001",
        "--model", "/models/tiny", "--threads", "1",
    ]  # fmt: skip
    bare = serve_command(ReplicaSpec(variant="b", recipe="baseline", extra_args=("--max-num-seqs", "4")), 1)
    assert bare[0] == sys.executable and "--model" not in bare and bare[-2:] == ["--max-num-seqs", "4"]
    default = serve_command(ReplicaSpec(variant="d", recipe=None, region="eu"), 1, replica_id="d-1", parent_pid=7)
    assert "--recipe" not in default  # the replica serves its own default recipe
    assert default[default.index("--replica-id") :] == [
        "--replica-id", "d-1", "--replica-region", "eu", "--replica-variant", "d", "--parent-pid", "7",
    ]  # fmt: skip


def test_start_probe_ready():
    world = World()
    backend = world.backend()
    replica = backend.start(SPEC)
    assert replica.url == "http://127.0.0.1:9001" and replica.state is ReplicaState.STARTING
    process = world.processes[replica.replica_id]
    assert process.argv[process.argv.index("--port") + 1] == "9001"
    assert process.argv[process.argv.index("--replica-id") + 1] == replica.replica_id
    assert process.argv[process.argv.index("--parent-pid") + 1] == "4242"  # it leaves when the gateway is gone
    assert process.env["X"] == "1" and process.env["OMP_NUM_THREADS"] == "1" and process.env["PATH"] == "/bin"
    assert backend.health(replica.replica_id) is False
    world.ready_urls.add(replica.url)
    assert backend.health(replica.replica_id) is True
    assert backend.list()[0].state is ReplicaState.READY


def test_drain_then_stop_sends_sigterm_and_forgets_it():
    world = World()
    backend = world.backend()
    replica = backend.start(SPEC)
    backend.drain(replica.replica_id)
    assert backend.list()[0].state is ReplicaState.DRAINING
    assert world.processes[replica.replica_id].signals == []  # draining sends nothing
    backend.stop(replica.replica_id)
    assert world.processes[replica.replica_id].signals == ["TERM"]
    assert backend.list() == [] and backend.stopping == []
    assert backend.exited[-1].exit_code == 0
    backend.stop(replica.replica_id)  # again: harmless


def test_sigkill_when_sigterm_is_ignored_past_the_grace():
    world = World()
    backend = world.backend(kill_after_s=40.0)
    replica = backend.start(SPEC)
    process = world.processes[replica.replica_id]
    process.exit_on_term = False
    backend.stop(replica.replica_id)
    world.now = 39.0
    assert backend.stopping == [replica.replica_id] and process.signals == ["TERM"]
    world.now = 40.0
    backend.list()
    assert process.signals == ["TERM", "KILL"]
    assert backend.stopping == [] and backend.exited[-1].exit_code == -9


def test_a_process_that_dies_leaves_the_list():
    world = World()
    backend = world.backend()
    a, b = backend.start(SPEC), backend.start(SPEC)
    world.ready_urls.update({a.url, b.url})
    assert backend.pid(a.replica_id) == world.processes[a.replica_id].pid
    world.processes[a.replica_id].code = 1  # e.g. the model failed to load, or it was killed
    assert [r.replica_id for r in backend.list()] == [b.replica_id]
    assert backend.health(a.replica_id) is False
    assert backend.exited[-1].replica_id == a.replica_id and backend.exited[-1].exit_code == 1
    assert backend.pid(a.replica_id) is None


def test_spawn_failure_is_a_backend_error():
    def refuse(argv, env, replica_id):
        raise FileNotFoundError("no python")

    backend = LocalBackend(spawn=refuse, ports=lambda taken: 1, probe=lambda url: False, clock=lambda: 0.0)
    with pytest.raises(BackendError, match="cannot start"):
        backend.start(SPEC)
    assert backend.list() == []


def test_close_stops_everything():
    world = World()
    backend = world.backend()
    replicas = [backend.start(SPEC) for _ in range(3)]
    backend.close()
    assert backend.list() == []
    assert all(world.processes[r.replica_id].signals == ["TERM"] for r in replicas)


def test_exits_reports_each_ended_process_once_with_its_output():
    world = World()
    backend = world.backend()
    crashed, stopped = backend.start(SPEC), backend.start(SPEC)
    process = world.processes[crashed.replica_id]
    process.output = "INFO: loading\n2026 ERROR tandem.serve: cannot serve the model: bad parameter\nINFO: bye\n"
    process.code = 1
    backend.stop(stopped.replica_id)
    exits = {e.replica.replica_id: e for e in backend.exits()}
    assert set(exits) == {crashed.replica_id, stopped.replica_id}
    assert not exits[crashed.replica_id].expected and exits[crashed.replica_id].code == 1
    assert exits[crashed.replica_id].replica.state is ReplicaState.STARTING  # it never became ready
    assert exits[crashed.replica_id].error.endswith("cannot serve the model: bad parameter")
    assert exits[stopped.replica_id].expected and exits[stopped.replica_id].code == 0
    assert backend.exits() == []


def test_ports_come_from_a_range_skipping_held_and_busy_ones():
    busy = {9002}
    ports = PortRange(9000, 9003, bindable=lambda port: port not in busy)
    assert ports(set()) == 9000
    assert ports({9000}) == 9001
    assert ports({9000, 9001}) == 9003  # 9002 is bound by someone else
    assert ports({9001, 9003}) == 9000  # round the range
    with pytest.raises(BackendError, match="no free port in 9000-9003"):
        ports({9000, 9001, 9003})
    with pytest.raises(ValueError):
        PortRange(9001, 9000)


def test_the_ports_replicas_hold_are_never_handed_out_again():
    world = World()
    backend = world.backend()
    a = backend.start(SPEC)
    world.processes[a.replica_id].exit_on_term = False
    backend.stop(a.replica_id)  # still shutting down: its port is still taken
    backend.start(SPEC)
    assert world.taken_seen[-1] == {9001}


def test_readiness_probes_share_one_http_client(monkeypatch):
    """A client per probe built a TLS context (the CA bundle) per replica per tick: ~20 ms of CPU each."""
    import httpx

    from tandem.cluster import local

    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200 if request.url.host == "ready" else 503)

    monkeypatch.setattr(local, "_probe_client", httpx.Client(transport=httpx.MockTransport(answer)))
    assert local.http_ready_probe("http://ready:1") is True
    assert local.http_ready_probe("http://loading:1") is False
    assert local.http_ready_probe("http://ready:1", path="/health") is True
    assert seen == ["http://ready:1/ready", "http://loading:1/ready", "http://ready:1/health"]
    assert local._probe_http() is local._probe_http()


def test_a_start_that_fails_before_a_process_exists_is_a_backend_error_naming_the_replica():
    def no_port(taken):
        raise BackendError("no free port in 9000-9000 (0 held by replicas)")

    def no_file(argv, env, replica_id):
        raise OSError(36, "File name too long")

    for backend in (LocalBackend(spawn=World().spawn, ports=no_port), LocalBackend(spawn=no_file, ports=lambda t: 1)):
        with pytest.raises(
            BackendError, match=r"cannot start replica fast-1: .*(no free port|File name too long)"
        ) as e:
            backend.start(SPEC)
        assert e.value.replica_id == "fast-1" and backend.list() == []


def test_a_replica_log_file_name_fits_whatever_the_variant_is_called(tmp_path):
    assert log_file_name("int8-ngram-3") == "int8-ngram-3.log"
    long_id = "speculative-k-4-draft-" + "very-long-directory-name-" * 20 + "7"
    name = log_file_name(long_id)
    assert len(name) <= 104 and name.startswith("speculative-k-4-draft-very-long") and name.endswith(".log")
    assert log_file_name(long_id[:-1] + "8") != name  # the replica's number is in the hash
    assert "/" not in log_file_name("../etc/passwd-1") and not log_file_name("../x").startswith(".")
    process = popen_spawner(tmp_path)([sys.executable, "-c", "print('hello')"], {}, long_id)
    assert process.process.wait(30) == 0
    assert (tmp_path / name).read_text() == "hello\n"


MiB = 1 << 20


def test_a_replica_that_does_not_fit_the_budget_waits_with_no_process_until_memory_frees(caplog):
    world = World()
    backend = world.backend(memory_bytes=1000 * MiB)
    first = backend.start(ReplicaSpec(variant="a", recipe="baseline", memory_bytes=600 * MiB))
    second = backend.start(ReplicaSpec(variant="b", recipe="int8", memory_bytes=500 * MiB))
    assert second.state is ReplicaState.STARTING and second.url == "" and second.replica_id not in world.processes
    assert second.pending.reason == "no room: needs 500 MiB, free 400 MiB on node local"
    assert "waits for memory: no room: needs 500 MiB" in caplog.text
    assert [r.replica_id for r in backend.list()] == [first.replica_id, second.replica_id]
    assert backend.health(second.replica_id) is False and backend.exits() == []
    world.processes[first.replica_id].exit_on_term = False
    world.now = 5.0
    backend.stop(first.replica_id)
    backend.exits()
    assert second.replica_id not in world.processes  # the first still holds its memory while it shuts down
    world.processes[first.replica_id].code = 0
    assert [e.replica.replica_id for e in backend.exits()] == [first.replica_id]  # it exited: b is placed
    (placed,) = backend.list()
    assert placed.replica_id == second.replica_id and placed.pending is None and placed.url and placed.started_at == 5.0
    assert second.replica_id in world.processes
    assert backend.room()[0].used_bytes == 500 * MiB


def test_a_waiting_replica_stopped_leaves_and_one_that_cannot_spawn_is_a_failed_start():
    world = World()
    backend = world.backend(memory_bytes=1000 * MiB)
    holder = backend.start(ReplicaSpec(variant="a", recipe=None, memory_bytes=900 * MiB))
    left = backend.start(ReplicaSpec(variant="b", recipe=None, memory_bytes=500 * MiB))
    doomed = backend.start(ReplicaSpec(variant="c", recipe=None, memory_bytes=400 * MiB))
    backend.drain(left.replica_id)  # a waiting replica holds no request: it just leaves
    assert [(e.replica.replica_id, e.expected) for e in backend.exits()] == [(left.replica_id, True)]
    backend.spawn = lambda argv, env, rid: (_ for _ in ()).throw(OSError("no python"))  # the next spawn fails
    world.processes[holder.replica_id].code = 1
    ended = {e.replica.replica_id: e for e in backend.exits()}
    assert (
        not ended[doomed.replica_id].expected
        and "cannot start replica c-3: no python" in ended[doomed.replica_id].output
    )
    assert backend.list() == []


def test_the_default_budget_is_this_machines_ram_less_its_margin():
    from tandem.cluster.room import local_memory_budget

    assert World().backend().room()[0].memory_bytes == local_memory_budget()
