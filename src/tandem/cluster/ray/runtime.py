"""RayPlacer: the Placer on a real Ray cluster, and `connect`, which joins (or starts) one.

The only module of tandem that imports `ray`, and only inside functions: `tandem[ray]` is an
optional extra, and a gateway on the local backend never loads it (an import-linter contract keeps
every other module off it).

Each replica is an actor (`ReplicaHost`) that asks for the replica's resources (CPUs, `memory`,
GPUs, the region as a node label selector), spread over the nodes as Ray Serve spreads its
replicas, never restarted by Ray (the controller replaces replicas, with its backoff). The actor
launches the server and answers `launch()` with its address; a call to `wait_exit()` stays pending
until the server exits. `poll()` asks Ray, without waiting, which of those calls finished: an error
from one says the actor or its node was lost.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.cluster.backend import BackendError, ReplicaSpec
from tandem.cluster.ray.demand import REGION_LABEL, Demand, NodeView, describe_resources
from tandem.cluster.ray.host import ReplicaHost
from tandem.cluster.ray.placer import Ended, Placement, Placing, Running, Status

__all__ = ["NAMESPACE", "RayPlacer", "connect", "describe_cluster", "loss_reason"]

logger = logging.getLogger("tandem.cluster")

NAMESPACE = "tandem"
HOST_CONCURRENCY = 4  # wait_exit blocks one thread of the actor; terminate and kill need others
# Ray runs its workers at nice 15 (RAY_worker_niceness) and a replica's server inherits it: on a busy
# node it got less CPU than a local replica (bench_ray: 0.85-1.04x the throughput under load).
# Serving is the node's foreground work, so its actors' workers run at 0, as Ray's own job
# supervisors do.
HOST_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}


def loss_reason(exc: BaseException) -> str:
    """One line for an operator from a Ray error: why the actor is gone (its node died, it was killed...)."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    because = next((line for line in lines if "because" in line), None)
    reason = because or (lines[0] if lines else type(exc).__name__)
    return f"{type(exc).__name__}: {reason}"


@dataclass
class _Actor:
    handle: Any
    launched: Any  # ObjectRef of launch(): the Placement
    exited: Any = None  # ObjectRef of wait_exit(): (code, output), once launched
    status: Status = Placing()


class RayPlacer:
    """Replicas as Ray actors. `ray` is the imported module (tests may pass a stand-in)."""

    def __init__(
        self,
        ray: Any = None,
        *,
        log_dir: str | None = None,
        ports: tuple[int, int] | None = None,
        unset_env: Collection[str] = (),
        extra_env: Mapping[str, str] | None = None,
        spread: bool = True,
    ) -> None:
        if ray is None:
            import ray
        self.ray = ray
        self.log_dir = log_dir
        self.ports = ports
        self.unset_env = tuple(unset_env)
        self.extra_env = dict(extra_env or {})  # the fleet secret: in the replica's environment, never its argv
        self.spread = spread
        self._host_class = ray.remote(ReplicaHost)
        self._actors: dict[str, _Actor] = {}

    def options(self, demand: Demand, node_id: str | None = None) -> dict[str, Any]:
        """The actor's options: its resources, its region (or the node tandem placed it on), no restarts by Ray."""
        options: dict[str, Any] = {
            "num_cpus": demand.cpus,
            "max_restarts": 0,
            "max_task_retries": 0,
            "max_concurrency": HOST_CONCURRENCY,
            "runtime_env": HOST_RUNTIME_ENV,
        }
        if demand.memory_bytes:
            options["memory"] = demand.memory_bytes
        if demand.accelerators:
            options["num_gpus"] = demand.accelerators
        if demand.accelerator_type:
            options["accelerator_type"] = demand.accelerator_type
        if demand.region is not None:
            options["label_selector"] = {REGION_LABEL: demand.region}
        if node_id is not None:  # tandem's placement by memory (tandem.cluster.ray.packing): that node only
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        elif self.spread:
            options["scheduling_strategy"] = "SPREAD"
        return options

    # --- Placer ----------------------------------------------------------------------------------
    def place(self, replica_id: str, spec: ReplicaSpec, demand: Demand, node_id: str | None = None) -> None:
        handle = self._host_class.options(**self.options(demand, node_id)).remote(
            replica_id, spec, self.log_dir, self.ports, self.unset_env, self.extra_env
        )
        self._actors[replica_id] = _Actor(handle, handle.launch.remote())

    def poll(self) -> Mapping[str, Status]:
        ray = self.ray
        watched = {}
        for replica_id, actor in self._actors.items():
            if isinstance(actor.status, Placing):
                watched[actor.launched] = replica_id
            elif isinstance(actor.status, Running):
                watched[actor.exited] = replica_id
        if watched:
            ready, _ = ray.wait(list(watched), num_returns=len(watched), timeout=0, fetch_local=True)
            for ref in ready:
                self._settle(watched[ref], ref)
        return {replica_id: actor.status for replica_id, actor in self._actors.items()}

    def _settle(self, replica_id: str, ref: Any) -> None:
        actor = self._actors[replica_id]
        exceptions = self.ray.exceptions
        try:
            value = self.ray.get(ref, timeout=0)
        except exceptions.ActorUnavailableError as exc:  # unreachable for now; dead ones raise ActorDiedError
            if ref is actor.exited:
                actor.exited = actor.handle.wait_exit.remote()  # ask again: the next answer tells
            else:
                actor.status = Ended(None, loss_reason(exc), lost=True)
            return
        except exceptions.RayActorError as exc:
            actor.status = Ended(None, loss_reason(exc), lost=True)
            return
        except exceptions.RayTaskError as exc:  # launch() raised on the node (the server could not start)
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            actor.status = Ended(None, f"{type(cause).__name__}: {cause}")
            return
        except exceptions.RayError as exc:
            actor.status = Ended(None, loss_reason(exc), lost=True)
            return
        if isinstance(value, Placement):
            actor.status = Running(value)
            actor.exited = actor.handle.wait_exit.remote()
        else:
            code, output = value
            actor.status = Ended(code, output)

    def terminate(self, replica_id: str) -> None:
        actor = self._actors.get(replica_id)
        if actor is not None and isinstance(actor.status, Running):
            actor.handle.terminate.remote()

    def kill(self, replica_id: str) -> None:
        actor = self._actors.get(replica_id)
        if actor is not None and isinstance(actor.status, Running):
            actor.handle.kill.remote()

    def release(self, replica_id: str) -> None:
        actor = self._actors.pop(replica_id, None)
        if actor is not None:
            try:
                self.ray.kill(actor.handle, no_restart=True)
            except Exception as exc:  # already gone with its node
                logger.debug("releasing the actor of %s: %s", replica_id, exc)

    def nodes(self) -> Sequence[NodeView]:
        try:
            from ray._private.state import available_resources_per_node  # DeveloperAPI

            available = available_resources_per_node()
        except Exception:  # an older or newer Ray without it: say what is known, the totals
            available = None
        views = []
        for node in self.ray.nodes():
            if not node.get("Alive"):
                continue
            total = dict(node.get("Resources") or {})
            views.append(
                NodeView(
                    node_id=node["NodeID"],
                    address=node.get("NodeManagerAddress", ""),
                    labels=dict(node.get("Labels") or {}),
                    total=total,
                    available=dict(available.get(node["NodeID"], {})) if available is not None else total,
                )
            )
        return views

    def waiting(self) -> Sequence[Mapping[str, float]] | None:
        try:
            from ray.autoscaler.v2.sdk import get_cluster_status  # what `ray status` reads

            status = get_cluster_status(self.ray.get_runtime_context().gcs_address)
        except Exception as exc:
            logger.debug("Ray's pending demands are unknown: %s", exc)
            return None
        shapes = []
        for demand in status.resource_demands.ray_task_actor_demand:
            shapes += [dict(request.bundle) for request in demand.bundles_by_count]
        return shapes

    # --- for tests and operators -----------------------------------------------------------------
    def placement(self, replica_id: str) -> Placement | None:
        actor = self._actors.get(replica_id)
        return actor.status.placement if actor is not None and isinstance(actor.status, Running) else None


def describe_cluster(nodes: Sequence[NodeView]) -> str:
    """'3 nodes: CPU 6, memory 10.00 GiB; regions eu, us' (what the gateway's banner says)."""
    total: dict[str, float] = {}
    for node in nodes:
        for name in ("CPU", "memory", "GPU"):
            if node.total.get(name):
                total[name] = total.get(name, 0.0) + node.total[name]
    regions = sorted({n.region for n in nodes if n.region is not None})
    where = f"; regions {', '.join(regions)}" if regions else f"; no node has a {REGION_LABEL} label"
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)}: {describe_resources(total)}{where}"


def _started_here() -> str | None:
    """The address of the cluster `ray start --head` left on this machine, as ray.init() finds it."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(None)
    except Exception:  # several clusters, an unreadable address file: ray.init() would not pick one either
        return None


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing answers at HOST:PORT (None: something does). ray.init() would retry for ever."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return f"{address!r} is not HOST:PORT"
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


def connect(
    address: str | None = None,
    environ: Mapping[str, str] | None = None,
    ray: Any = None,
    started_here: Callable[[], str | None] = _started_here,
    unreachable: Callable[[str], str | None] = _unreachable,
) -> str:
    """Join a Ray cluster the way `ray.init()` finds one, and say which it did.

    `address` (--ray-address, the deployment's backend.address; `auto`: the one on this machine)
    first; else RAY_ADDRESS; else the cluster `ray start --head` left on this machine; else a new
    local cluster in this process. A process already connected (tests, a notebook) keeps its
    cluster. BackendError, at once, if the cluster cannot be reached (ray.init() would wait for it
    for ever).
    """
    if ray is None:
        import ray
    environ = os.environ if environ is None else environ
    if ray.is_initialized():
        return f"using the Ray cluster this process is connected to ({ray.get_runtime_context().gcs_address})"
    if address is not None:
        source, target = "given", address
    elif environ.get("RAY_ADDRESS"):
        source, target = "RAY_ADDRESS", environ["RAY_ADDRESS"]
    else:
        source, target = "started on this machine with `ray start`", started_here()
    if target == "auto":
        target = started_here()
        if target is None:
            raise BackendError("no Ray cluster to connect to: none was started on this machine with `ray start`")
    if target is not None and (why := unreachable(target)) is not None:
        raise BackendError(f"cannot reach the Ray cluster at {target} ({source}): {why}")
    try:
        if target is None:
            ray.init(address="local", namespace=NAMESPACE, log_to_driver=False)
        else:
            ray.init(address=target, namespace=NAMESPACE, log_to_driver=False)
    except Exception as exc:  # ConnectionError, a bad address, a version mismatch: one line, no traceback
        raise BackendError(f"cannot connect to the Ray cluster at {target} ({source}): {exc}") from None
    gcs = ray.get_runtime_context().gcs_address
    if target is None:
        return f"started a local Ray cluster at {gcs} (no RAY_ADDRESS, and no `ray start` cluster on this machine)"
    return f"connected to the Ray cluster at {gcs} ({source})"
