"""LocalBackend: each replica is its own OS process (`tandem serve` on a loopback port).

Side effects come in as arguments, each with a real default: `spawn` starts a process, `free_port`
finds a port, `probe` asks a URL whether the server is ready, `clock` tells the time. Unit tests
pass fakes for all four; nothing here sleeps or waits for a process.

`stop` sends SIGTERM (the server stops admitting, finishes in-flight requests, exits 0) and returns
at once; a process still alive `kill_after_s` later gets SIGKILL on the next `list()`. The caller
drains first (stop routing, wait for in-flight to reach zero): see tandem.schedule.controller.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from tandem.cluster.backend import BackendError, Replica, ReplicaSpec, ReplicaState

__all__ = ["LocalBackend", "ProcessHandle", "serve_command", "popen_spawner", "find_free_port", "http_ready_probe"]

logger = logging.getLogger("tandem.cluster")


class ProcessHandle(Protocol):
    """The part of subprocess.Popen the backend uses."""

    pid: int

    def poll(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


Spawner = Callable[[list[str], Mapping[str, str], str], ProcessHandle]  # argv, env, replica id -> process


def serve_command(spec: ReplicaSpec, port: int, host: str = "127.0.0.1", python: str = sys.executable) -> list[str]:
    """The command line of one replica: `python -m tandem.cli serve --recipe R --host H --port P ...`."""
    argv = [python, "-m", "tandem.cli", "serve", "--recipe", spec.recipe, "--host", host, "--port", str(port)]
    if spec.model is not None:
        argv += ["--model", spec.model]
    if spec.threads is not None:
        argv += ["--threads", str(spec.threads)]
    return argv + list(spec.extra_args)


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (another process could take it before the replica binds: rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def http_ready_probe(base_url: str, timeout_s: float = 1.0) -> bool:
    """GET {base_url}/ready answers 200 once the model is served (503 while loading or draining)."""
    import httpx

    try:
        return httpx.get(f"{base_url}/ready", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def popen_spawner(log_dir: str | Path | None = None) -> Spawner:
    """Start replicas with subprocess.Popen in their own session (the gateway, not the terminal's
    Ctrl-C, decides when they stop); output goes to LOG_DIR/<replica id>.log, or is discarded."""

    def spawn(argv: list[str], env: Mapping[str, str], replica_id: str) -> ProcessHandle:
        if log_dir is None:
            out = subprocess.DEVNULL
        else:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            out = open(Path(log_dir) / f"{replica_id}.log", "ab")  # the child gets its own descriptor
        try:
            return subprocess.Popen(
                argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # the child has its own descriptor now

    return spawn


@dataclass
class _Process:
    replica: Replica
    handle: ProcessHandle
    kill_at: float | None = None  # set once SIGTERM was sent


class LocalBackend:
    def __init__(
        self,
        spawn: Spawner | None = None,
        free_port: Callable[[], int] = find_free_port,
        probe: Callable[[str], bool] = http_ready_probe,
        clock: Callable[[], float] = time.monotonic,
        host: str = "127.0.0.1",
        kill_after_s: float = 40.0,
        base_env: Mapping[str, str] | None = None,
        command: Callable[[ReplicaSpec, int, str], list[str]] = serve_command,
    ) -> None:
        self.spawn = spawn or popen_spawner()
        self.free_port = free_port
        self.probe = probe
        self.clock = clock
        self.host = host
        self.kill_after_s = kill_after_s  # longer than the server's own shutdown timeout (30 s by default)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.command = command
        self._live: dict[str, _Process] = {}
        self._stopping: dict[str, _Process] = {}
        self._lock = threading.Lock()  # the gateway's event loop and the controller's thread both call in
        self._next = 0
        self.exited: list[Replica] = []  # replicas whose processes ended, newest last (for logs and tests)

    def start(self, spec: ReplicaSpec) -> Replica:
        with self._lock:
            self._next += 1
            replica_id = f"{spec.variant}-{self._next}"
        port = self.free_port()
        env = dict(self.base_env)
        env.update(spec.env)
        if spec.threads is not None:  # keep OpenMP pools of several replicas from fighting over cores
            env.setdefault("OMP_NUM_THREADS", str(spec.threads))
        argv = self.command(spec, port, self.host)
        try:
            handle = self.spawn(argv, env, replica_id)
        except OSError as exc:
            raise BackendError(f"cannot start replica {replica_id}: {exc}") from exc
        url = f"http://{self.host}:{port}"
        replica = Replica(replica_id, spec, ReplicaState.STARTING, url=url, started_at=self.clock())
        with self._lock:
            self._live[replica_id] = _Process(replica, handle)
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
        ready = self.probe(proc.replica.url)
        with self._lock:
            if ready and proc.replica.state is ReplicaState.STARTING and replica_id in self._live:
                proc.replica = replace(proc.replica, state=ReplicaState.READY)
        return ready

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
        with self._lock:
            for replica_id, proc in list(self._live.items()):
                code = proc.handle.poll()
                if code is not None:  # died on its own: a crash, a failed load, an OOM kill
                    del self._live[replica_id]
                    self.exited.append(replace(proc.replica, state=ReplicaState.STOPPED, exit_code=code))
                    logger.warning("replica %s exited unexpectedly (code %s)", replica_id, code)
            for replica_id, proc in list(self._stopping.items()):
                code = proc.handle.poll()
                if code is not None:
                    del self._stopping[replica_id]
                    self.exited.append(replace(proc.replica, exit_code=code))
                elif proc.kill_at is not None and now >= proc.kill_at:
                    logger.warning("replica %s outlived its shutdown grace; SIGKILL", replica_id)
                    proc.handle.kill()
                    proc.kill_at = None  # once

    def _get(self, replica_id: str) -> _Process:
        try:
            return self._live[replica_id]
        except KeyError:
            raise BackendError(f"no replica {replica_id!r}") from None
