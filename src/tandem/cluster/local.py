"""LocalBackend: each replica is its own OS process (`tandem serve` on a loopback port).

Side effects come in as arguments, each with a real default: `spawn` starts a process (its output
to a log file per replica), `ports` picks a port (any free one, or one from a range), `probe` asks
a URL whether the server is ready, `clock` tells the time. Unit tests pass fakes for all four;
nothing here sleeps or waits for a process.

`stop` sends SIGTERM (the server stops admitting, finishes in-flight requests, exits 0) and returns
at once; a process still alive `kill_after_s` later gets SIGKILL on the next `list()`. The caller
drains first (stop routing, wait for in-flight to reach zero): see tandem.schedule.controller.
A process that ends, asked to or not, is reported once by `exits()` with the end of its output;
one that ends unasked is logged with that output. Every replica is told the gateway's pid
(`--parent-pid`) and leaves when it is gone, even after a SIGKILL (tandem.edge.lifeline).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from tandem.cluster.backend import BackendError, Replica, ReplicaExit, ReplicaSpec, ReplicaState
from tandem.cluster.external import FLEET_SECRET_ENV, external_command, render
from tandem.cluster.names import bounded_name

__all__ = [
    "LocalBackend",
    "LoggedProcess",
    "PortRange",
    "ProcessHandle",
    "find_free_port",
    "http_ready_probe",
    "log_file_name",
    "popen_spawner",
    "probe_ready",
    "replica_launch",
    "serve_command",
]

logger = logging.getLogger("tandem.cluster")

OUTPUT_TAIL_BYTES = 4000  # how much of a dead replica's output is kept and logged


class ProcessHandle(Protocol):
    """The part of subprocess.Popen the backend uses, plus the end of the process's output."""

    pid: int

    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def output_tail(self) -> str: ...


Spawner = Callable[[list[str], Mapping[str, str], str], ProcessHandle]  # argv, env, replica id -> process
PortPicker = Callable[[Collection[int]], int]  # ports this backend's replicas hold -> a port to use


def serve_command(
    spec: ReplicaSpec,
    port: int,
    host: str = "127.0.0.1",
    replica_id: str | None = None,
    *,
    parent_pid: int | None = None,
    python: str = sys.executable,
) -> list[str]:
    """One replica's command line: `python -m tandem.cli serve [--recipe R] --host H --port P ...`.

    The recipe goes as text (the replica validates it, and reports its own errors); none means the
    replica's default. The identity flags are what the replica reports on GET /load.
    """
    argv = [python, "-m", "tandem.cli", "serve"]
    if spec.recipe is not None:
        argv += ["--recipe", spec.recipe]
    argv += ["--host", host, "--port", str(port)]
    if spec.model is not None:
        argv += ["--model", spec.model]
    if spec.threads is not None:
        argv += ["--threads", str(spec.threads)]
    if replica_id is not None:
        argv += ["--replica-id", replica_id, "--replica-region", spec.region, "--replica-variant", spec.variant]
    if parent_pid is not None:
        argv += ["--parent-pid", str(parent_pid)]
    return argv + list(spec.extra_args)


def replica_launch(
    spec: ReplicaSpec,
    port: int,
    host: str,
    replica_id: str,
    env: Mapping[str, str],
    *,
    parent_pid: int | None,
    command: Callable[..., list[str]] = serve_command,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of one replica: `tandem serve` (`command`), or an external engine's rendered
    template on a tether. An external engine gets the fleet's secret only where its template says
    `{api_key}` (tandem.cluster.external)."""
    env = dict(env)
    engine = spec.engine
    if engine is None:
        return command(spec, port, host, replica_id, parent_pid=parent_pid), env
    secret = env.pop(FLEET_SECRET_ENV, "")
    values = {
        "port": str(port), "host": host, "model": spec.model or "", "threads": str(spec.threads or 1),
        "served_model_name": engine.served_model_name or spec.model or spec.variant, "replica_id": replica_id,
        "variant": spec.variant, "region": spec.region, "accelerators": str(max(1, round(spec.accelerators))),
        "api_key": secret,
    }  # fmt: skip
    env.update((name, render(value, values)) for name, value in engine.env)
    return external_command(engine, values, parent_pid=parent_pid), env


def find_free_port(taken: Collection[int] = (), host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (another process could take it before the replica binds: rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortRange:
    """Ports from `low`..`high` (a firewall's opening): the next one this backend does not hold and the
    OS lets us bind, going round the range so a port just given up is the last to be reused."""

    def __init__(
        self, low: int, high: int, bindable: Callable[[int], bool] | None = None, *, host: str = "127.0.0.1",
        start: int | None = None,
    ) -> None:  # fmt: skip
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"a port range needs 1 <= low <= high <= 65535 (got {low}-{high})")
        self.low, self.high = low, high
        self.bindable = bindable or (lambda port: _bindable(port, host))
        self._next = low if start is None else low + (start - low) % (high - low + 1)

    def __call__(self, taken: Collection[int]) -> int:
        size = self.high - self.low + 1
        for i in range(size):
            port = self.low + (self._next - self.low + i) % size
            if port not in taken and self.bindable(port):
                self._next = self.low + (port - self.low + 1) % size
                return port
        raise BackendError(f"no free port in {self.low}-{self.high} ({len(taken)} held by replicas)")


_probe_client: Any = None
_probe_client_lock = threading.Lock()


def _probe_http() -> Any:
    """One HTTP client for every readiness probe of this process, made on first use and kept.

    A client per probe (httpx.get) builds a TLS context each time, loading the CA bundle: ~20 ms of
    CPU per probe, per replica, every tick, taken from the replicas on the same machine. One kept
    client also keeps its connections alive. httpx.Client is safe to share between threads."""
    global _probe_client
    import httpx

    with _probe_client_lock:
        if _probe_client is None:
            _probe_client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=64))
        return _probe_client


def http_ready_probe(base_url: str, timeout_s: float = 1.0, path: str = "/ready") -> bool:
    """GET {base_url}{path} answers 200 once the model is served (tandem's /ready: 503 while loading or
    draining; an external engine's own path, e.g. vLLM's /health)."""
    import httpx

    try:
        return _probe_http().get(f"{base_url}{path}", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


class LoggedProcess:
    """A Popen whose stdout and stderr go to `log_path` (or nowhere), with the end of that file at hand."""

    def __init__(self, process: subprocess.Popen, log_path: Path | None) -> None:
        self.process = process
        self.log_path = log_path
        self.pid = process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()

    def output_tail(self) -> str:
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - OUTPUT_TAIL_BYTES))
                return log.read().decode(errors="replace")
        except OSError:
            return ""


LOG_NAME_CHARS = 100  # a replica's log file name, less ".log"; file systems allow 255 bytes


def log_file_name(replica_id: str) -> str:
    """`<replica id>.log`; a longer id (a variant named at length) is cut to its start and a short hash
    of it (tandem.cluster.names): a file name must fit in 255 bytes, or no replica ever starts."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", replica_id).lstrip(".") or "replica"
    return bounded_name(safe, LOG_NAME_CHARS, source=replica_id) + ".log"


def popen_spawner(log_dir: str | Path | None = None) -> Spawner:
    """Start replicas with subprocess.Popen in their own session (the gateway, not the terminal's
    Ctrl-C, decides when they stop); output goes to LOG_DIR/<replica id>.log (`log_file_name`), or
    is discarded."""

    def spawn(argv: list[str], env: Mapping[str, str], replica_id: str) -> ProcessHandle:
        path = None
        if log_dir is None:
            out = subprocess.DEVNULL
        else:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            path = Path(log_dir) / log_file_name(replica_id)
            out = open(path, "ab")  # noqa: SIM115 (the child gets its own descriptor; ours closes below)
        try:
            process = subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        return LoggedProcess(process, path)

    return spawn


def probe_ready(probe: Callable[..., bool], url: str, spec: ReplicaSpec) -> bool:
    """Ask `probe` whether the replica at `url` is ready: at its engine's readiness path where that is
    not tandem's /ready (so probes written for tandem replicas, `probe(url)`, keep working)."""
    if spec.ready_path == "/ready":
        return probe(url)
    return probe(url, path=spec.ready_path)


@dataclass
class _Process:
    replica: Replica
    handle: ProcessHandle
    port: int
    kill_at: float | None = None  # set once SIGTERM was sent


class LocalBackend:
    def __init__(
        self,
        spawn: Spawner | None = None,
        ports: PortPicker = find_free_port,
        probe: Callable[[str], bool] = http_ready_probe,
        clock: Callable[[], float] = time.monotonic,
        host: str = "127.0.0.1",
        kill_after_s: float = 40.0,
        base_env: Mapping[str, str] | None = None,
        command: Callable[..., list[str]] = serve_command,
        parent_pid: int | None = None,
    ) -> None:
        self.spawn = spawn or popen_spawner()
        self.ports = ports
        self.probe = probe
        self.clock = clock
        self.host = host
        self.kill_after_s = kill_after_s  # longer than the server's own shutdown timeout (30 s by default)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.command = command
        self.parent_pid = os.getpid() if parent_pid is None else parent_pid
        self._live: dict[str, _Process] = {}
        self._stopping: dict[str, _Process] = {}
        self._lock = threading.Lock()  # the gateway's event loop and the controller's thread both call in
        self._next = 0
        self._exits: list[ReplicaExit] = []  # not yet taken by exits()
        self.exited: deque[Replica] = deque(maxlen=200)  # replicas whose processes ended, newest last

    def start(self, spec: ReplicaSpec) -> Replica:
        with self._lock:
            self._next += 1
            replica_id = f"{spec.variant}-{self._next}"
            taken = {p.port for p in (*self._live.values(), *self._stopping.values())}
        # Whatever stops it before a process exists (no free port, a log file that cannot be opened, a
        # program that is not there) is a BackendError naming the replica: the controller counts it
        # as a failed start and backs off, as it does for a replica that exits.
        try:
            port = self.ports(taken)
            env = dict(self.base_env)
            env.update(spec.env)
            if spec.threads is not None:  # keep OpenMP pools of several replicas from fighting over cores
                env.setdefault("OMP_NUM_THREADS", str(spec.threads))
            argv, env = replica_launch(
                spec, port, self.host, replica_id, env, parent_pid=self.parent_pid, command=self.command
            )
            handle = self.spawn(argv, env, replica_id)
        except (BackendError, OSError) as exc:
            raise BackendError(f"cannot start replica {replica_id}: {exc}", replica_id=replica_id) from exc
        url = f"http://{self.host}:{port}"
        replica = Replica(replica_id, spec, ReplicaState.STARTING, url=url, started_at=self.clock())
        with self._lock:
            self._live[replica_id] = _Process(replica, handle, port)
        logger.info("started replica %s (pid %s) at %s: %s", replica_id, handle.pid, url, " ".join(argv[1:]))
        return replica

    def drain(self, replica_id: str) -> None:
        with self._lock:
            proc = self._get(replica_id)
            proc.replica = replace(proc.replica, state=ReplicaState.DRAINING)

    def stop(self, replica_id: str) -> None:
        with self._lock:
            proc = self._live.pop(replica_id, None)
            if proc is None:
                return  # already gone (it may have exited on its own)
            proc.replica = replace(proc.replica, state=ReplicaState.STOPPED)
            proc.kill_at = self.clock() + self.kill_after_s
            self._stopping[replica_id] = proc
        if proc.handle.poll() is None:
            proc.handle.terminate()
        logger.info("stopping replica %s (SIGTERM)", replica_id)

    def list(self) -> list[Replica]:
        self._reap()
        with self._lock:
            return [p.replica for p in sorted(self._live.values(), key=lambda p: p.replica.started_at)]

    def health(self, replica_id: str) -> bool:
        self._reap()
        with self._lock:
            proc = self._live.get(replica_id)
        if proc is None:
            return False
        ready = probe_ready(self.probe, proc.replica.url, proc.replica.spec)
        with self._lock:
            if ready and proc.replica.state is ReplicaState.STARTING and replica_id in self._live:
                proc.replica = replace(proc.replica, state=ReplicaState.READY)
        return ready

    def exits(self) -> list[ReplicaExit]:
        self._reap()
        with self._lock:
            taken, self._exits = self._exits, []
        return taken

    def pid(self, replica_id: str) -> int | None:
        """The OS process id of a live replica (fault tests kill it to see what the gateway does)."""
        with self._lock:
            proc = self._live.get(replica_id)
            return proc.handle.pid if proc is not None else None

    def close(self) -> None:
        """Stop every replica (SIGTERM now; `list()` later SIGKILLs any that outlive kill_after_s)."""
        for replica in self.list():
            self.stop(replica.replica_id)

    @property
    def stopping(self) -> list[str]:
        """Replicas sent SIGTERM whose processes have not exited yet."""
        self._reap()
        with self._lock:
            return sorted(self._stopping)

    def _reap(self) -> None:
        now = self.clock()
        ended: list[ReplicaExit] = []
        with self._lock:
            for replica_id, proc in list(self._live.items()):
                code = proc.handle.poll()
                if code is not None:  # died on its own: a crash, a failed load, an OOM kill
                    del self._live[replica_id]
                    ended.append(ReplicaExit(proc.replica, code, expected=False, output=proc.handle.output_tail()))
            for replica_id, proc in list(self._stopping.items()):
                code = proc.handle.poll()
                if code is not None:
                    del self._stopping[replica_id]
                    output = proc.handle.output_tail() if code != 0 else ""
                    ended.append(ReplicaExit(proc.replica, code, expected=True, output=output))
                elif proc.kill_at is not None and now >= proc.kill_at:
                    logger.warning("replica %s outlived its shutdown grace; SIGKILL", replica_id)
                    proc.handle.kill()
                    proc.kill_at = None  # once
            self._exits += ended
            self.exited.extend(replace(e.replica, state=ReplicaState.STOPPED, exit_code=e.code) for e in ended)
        for ex in ended:
            if not ex.expected or ex.code not in (0, -signal.SIGTERM):  # SIGTERM before its handler: as asked
                how = "exited unexpectedly" if not ex.expected else "exited"
                tail = "\n".join(ex.output.splitlines()[-20:])
                logger.warning(
                    "replica %s %s (code %s) while %s; the end of its output:\n%s",
                    ex.replica.replica_id, how, ex.code, ex.replica.state.value, tail or "(none kept)",
                )  # fmt: skip

    def _get(self, replica_id: str) -> _Process:
        try:
            return self._live[replica_id]
        except KeyError:
            raise BackendError(f"no replica {replica_id!r}") from None
