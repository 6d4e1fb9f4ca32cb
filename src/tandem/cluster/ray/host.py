"""ReplicaHost: the Ray actor that is one replica. It runs on the node Ray placed it on and starts
`tandem serve` (or an external engine, on its tether) there as its child process, bound to the node's
address, and reports where it is.

The same command, port choice and logging as a local replica (tandem.cluster.local): only the
machine differs. The server is told the actor's pid (`--parent-pid`), so it leaves when the actor
does (a killed worker, a stopped gateway), the way a local replica outlives no gateway. Imports no
Ray at module level: the gateway may import this module without the optional extra.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Collection, Mapping

from tandem.cluster.backend import ReplicaSpec
from tandem.cluster.local import PortRange, ProcessHandle, find_free_port, popen_spawner, replica_launch
from tandem.cluster.ray.placer import Placement

__all__ = ["ReplicaHost"]

EXIT_POLL_S = 0.2


class ReplicaHost:
    """An actor body (wrapped by `ray.remote` at run time). Threaded: `wait_exit` blocks while
    `terminate` and `kill` stay callable."""

    def __init__(
        self,
        replica_id: str,
        spec: ReplicaSpec,
        log_dir: str | None = None,
        ports: tuple[int, int] | None = None,
        unset_env: Collection[str] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.spec = spec
        self.log_dir = log_dir
        self.ports = ports
        self.unset_env = frozenset(unset_env)
        self.extra_env = dict(extra_env or {})
        self.process: ProcessHandle | None = None

    def launch(self) -> Placement:
        import ray  # on the node, inside the actor

        host = ray.util.get_node_ip_address()
        if self.ports is not None:  # from a random start, so replicas launching at once on a node rarely collide
            port = PortRange(*self.ports, host=host, start=random.randint(*self.ports))(())
        else:
            port = find_free_port(host=host)
        env = {k: v for k, v in os.environ.items() if k.upper() not in self.unset_env}
        env.update(self.extra_env)
        env.update(self.spec.env)
        if self.spec.threads is not None:  # Ray sets it to the actor's CPUs; the server's threads decide
            env["OMP_NUM_THREADS"] = str(self.spec.threads)
        argv, env = replica_launch(self.spec, port, host, self.replica_id, env, parent_pid=os.getpid())
        self.process = popen_spawner(self.log_dir)(argv, env, self.replica_id)
        node_id = ray.get_runtime_context().get_node_id()
        return Placement(f"http://{host}:{port}", node_id, host, self.process.pid, host_pid=os.getpid())

    def wait_exit(self) -> tuple[int, str]:
        """Block until the server exits: (its exit code, the end of its output)."""
        assert self.process is not None, "launch() first"
        while (code := self.process.poll()) is None:
            time.sleep(EXIT_POLL_S)
        return code, self.process.output_tail()

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
