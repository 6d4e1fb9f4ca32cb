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

Memory: this machine is one node with a budget (`memory_bytes`; default: its RAM less a margin,
tandem.cluster.room.local_memory_budget). A replica whose `spec.memory_bytes` does not fit beside
the processes alive now waits: it is listed STARTING with `Replica.pending` saying why and no
process, and is spawned by the `exits()` (once per controller tick) after enough memory was freed
(a replica's bytes are held until its process has exited), the largest waiting first. A waiting
replica that is stopped simply leaves.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tandem.cluster.backend import BackendError, PendingPlacement, Replica, ReplicaExit, ReplicaSpec, ReplicaState
from tandem.cluster.external import FLEET_SECRET_ENV, external_command, render
from tandem.cluster.ports import PortRange, find_free_port
from tandem.cluster.room import LOCAL_NODE, MemoryLedger, NodeBudget, NodeRoom, local_memory_budget, placing_order
from tandem.cluster.spawn import OUTPUT_TAIL_BYTES, LoggedProcess, ProcessHandle, Spawner, log_file_name, popen_spawner

# Ports and spawning live in tandem.cluster.ports and tandem.cluster.spawn; re-exported here.
__all__ = [
    "OUTPUT_TAIL_BYTES",
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
        memory_bytes: int | None = None,
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
        self._waiting: dict[str, Replica] = {}  # started, waiting for memory: no process yet
        budget = local_memory_budget() if memory_bytes is None else memory_bytes
        self.memory = MemoryLedger([NodeBudget(LOCAL_NODE, budget)])
        self._lock = threading.Lock()  # the gateway's event loop and the controller's thread both call in
        self._placing = threading.RLock()  # one placement decision (and its spawn) at a time
        self._next = 0
        self._exits: list[ReplicaExit] = []  # not yet taken by exits()
        self.exited: deque[Replica] = deque(maxlen=200)  # replicas whose processes ended, newest last

    def start(self, spec: ReplicaSpec) -> Replica:
        with self._lock:
            self._next += 1
            replica_id = f"{spec.variant}-{self._next}"
        with self._placing:
            with self._lock:
                where = self.memory.decide(spec.memory_bytes) if not self._waiting else None
            if isinstance(where, str):
                return self._launch(replica_id, spec)
            waiting = Replica(replica_id, spec, ReplicaState.STARTING, started_at=self.clock())
            with self._lock:
                self._waiting[replica_id] = waiting
            self._place_waiting()  # it may fit before others waiting (a smaller one); else it waits
        with self._lock:
            proc = self._live.get(replica_id)
            return proc.replica if proc is not None else self._waiting[replica_id]

    def _launch(self, replica_id: str, spec: ReplicaSpec) -> Replica:
        """Spawn the replica's process and hold its memory (the placing lock is held)."""
        with self._lock:
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
            self.memory.hold(replica_id, LOCAL_NODE, spec.memory_bytes)
        logger.info("started replica %s (pid %s) at %s: %s", replica_id, handle.pid, url, " ".join(argv[1:]))
        return replica

    def _place_waiting(self) -> None:
        """Spawn the waiting replicas that fit now, largest first; the others say why they wait."""
        with self._placing:
            with self._lock:
                order = placing_order(self._waiting.values())
            for waiting in order:
                with self._lock:
                    if waiting.replica_id not in self._waiting:
                        continue  # stopped meanwhile
                    where = self.memory.decide(waiting.spec.memory_bytes)
                    if isinstance(where, PendingPlacement):
                        current = self._waiting[waiting.replica_id]
                        before = current.pending
                        self._waiting[waiting.replica_id] = replace(current, pending=where)
                    else:
                        del self._waiting[waiting.replica_id]
                if isinstance(where, PendingPlacement):
                    if before is None or before.cause != where.cause:
                        logger.warning("replica %s waits for memory: %s", waiting.replica_id, where.reason)
                    continue
                try:
                    self._launch(waiting.replica_id, waiting.spec)
                except BackendError as exc:  # counted by the controller as a failed start, as from start()
                    with self._lock:
                        self._exits.append(ReplicaExit(waiting, None, expected=False, output=str(exc)))
                        self.exited.append(replace(waiting, state=ReplicaState.STOPPED))

    def drain(self, replica_id: str) -> None:
        with self._lock:
            waiting = replica_id in self._waiting
            if not waiting:
                proc = self._get(replica_id)
                proc.replica = replace(proc.replica, state=ReplicaState.DRAINING)
        if waiting:  # it holds no request: nothing to finish
            self.stop(replica_id)

    def stop(self, replica_id: str) -> None:
        with self._lock:
            waiting = self._waiting.pop(replica_id, None)
            if waiting is not None:  # never placed: no process; it leaves
                gone = replace(waiting, state=ReplicaState.STOPPED)
                self._exits.append(ReplicaExit(gone, None, expected=True))
                self.exited.append(gone)
                return
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
            replicas = [p.replica for p in self._live.values()] + list(self._waiting.values())
        return sorted(replicas, key=lambda r: r.started_at)  # stable: started in the same instant, in order

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
        if self._waiting:
            self._place_waiting()
        with self._lock:
            taken, self._exits = self._exits, []
        return taken

    def room(self) -> list[NodeRoom]:
        """The node's memory budget and what live and stopping replicas hold of it."""
        with self._lock:
            return self.memory.rooms()

    def pid(self, replica_id: str) -> int | None:
        """The OS process id of a live replica (fault tests kill it to see what the gateway does)."""
        with self._lock:
            proc = self._live.get(replica_id)
            return proc.handle.pid if proc is not None else None

    def close(self) -> None:
        """Stop every replica (SIGTERM now; `list()` later SIGKILLs any past kill_after_s); waiting ones leave."""
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
                    self.memory.release(replica_id)
                    ended.append(ReplicaExit(proc.replica, code, expected=False, output=proc.handle.output_tail()))
            for replica_id, proc in list(self._stopping.items()):
                code = proc.handle.poll()
                if code is not None:
                    del self._stopping[replica_id]
                    self.memory.release(replica_id)
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
