"""Wiring: the scheduling layer's parts assembled into one `Gateway` (what the app, the proxy and the
admin API share), and the backend a gateway process starts replicas with (local processes, or a
Ray cluster: `choose_backend`).

Each fleet has its own secret (`new_fleet_secret`): the gateway sends it to its replicas on every
request, and hands it to them in their environment (FLEET_SECRET_ENV, never on a command line that
`ps` shows, never logged), so a replica's port is useless to anyone but its gateway.

Side effects come in as arguments: the backend (LocalBackend, or a FakeBackend in tests), the
clock, the transport to replicas (httpx's, or a MockTransport/FaultyTransport in tests), the
profile source (a `tandem profile` child process, or a fake).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from tandem.cluster.backend import Backend, BackendError, ReplicaState
from tandem.cluster.external import FLEET_SECRET_ENV
from tandem.cluster.local import LocalBackend, PortRange, find_free_port, popen_spawner
from tandem.deployment import Deployment, ProfileSource
from tandem.edge.settings import Settings, settings_environment, settings_variables
from tandem.gateway.liveness import Liveness
from tandem.gateway.metrics import GatewayMetrics
from tandem.gateway.observers import NO_OBSERVER, Observer, Observers
from tandem.gateway.shadow import GatewayShadow
from tandem.schedule.breaker import BreakerBoard
from tandem.schedule.controller import Controller
from tandem.schedule.dispatch import Dispatcher
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.profiles import cache_dir, cached_profile
from tandem.schedule.traffic import DemandMeter, InFlight
from tandem.schedule.variant import Variant

__all__ = [
    "FLEET_SECRET_ENV",
    "Gateway",
    "PendingUse",
    "build_gateway",
    "choose_backend",
    "default_log_dir",
    "local_backend",
    "new_fleet_secret",
    "refuse_the_gateways_port",
    "replica_environment",
]


def new_fleet_secret() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class PendingUse:
    """An operator's `POST /admin/use` being prepared (its Profile measured) before the rollout starts."""

    variant: str
    recipe: str | None
    step: str
    error: str | None = None


@dataclass
class Gateway:
    """Everything the gateway process holds; tests reach in (backend.pid, controller.use)."""

    deployment: Deployment
    backend: Backend
    controller: Controller
    dispatcher: Dispatcher
    inflight: InFlight
    demand: DemandMeter
    metrics: SchedulerMetrics
    requests: GatewayMetrics
    registry: CollectorRegistry
    variants: dict[str, Variant]  # every variant known by name: the deployment's and those rolled out since
    transport: httpx.AsyncBaseTransport | None = None
    buffer_timeout_s: float = 60.0  # how long a request waits at the gateway for a replica
    read_timeout_s: float = 300.0
    load_timeout_s: float = 1.0  # a replica's GET /load must answer within this
    shutdown_timeout_s: float = 30.0  # in-flight requests get this long after SIGTERM
    first_byte_timeout_s: float = 30.0  # tandem.gateway.liveness
    stream_idle_timeout_s: float = 30.0
    health_timeout_s: float = 2.0  # a replica that missed a non-streaming deadline must answer GET /health within this
    fleet_secret: str | None = field(default=None, repr=False)  # sent to replicas as their bearer token
    liveness: Liveness = field(default_factory=Liveness)
    clock: Callable[[], float] = time.monotonic
    profile: ProfileSource = cached_profile
    client: httpx.AsyncClient | None = None
    draining: bool = False  # SIGTERM: admitting nothing new; waiting requests get 503
    fatal: str | None = None  # the primary can never start: the process exits non-zero with this
    pending: PendingUse | None = None
    shadow: GatewayShadow | None = None  # the validation gate's shadow traffic, when the deployment has a gate
    observer: Observer = NO_OBSERVER  # told what happens to each request (tandem.gateway.observers): the shadow
    _changed: asyncio.Event | None = field(default=None, repr=False)

    def ready(self) -> bool:
        return any(r.variant == self.controller.primary and r.state is ReplicaState.READY for r in self.backend.list())

    # Requests waiting for a replica sleep until something changes (a tick, a request ending, a drain).
    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_change(self, timeout_s: float) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            pass

    def begin_drain(self) -> None:
        self.draining = True
        self.notify()


def build_gateway(
    deployment: Deployment,
    backend: Backend | None = None,
    *,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
    transport: httpx.AsyncBaseTransport | None = None,
    buffer_timeout_s: float = 60.0,
    read_timeout_s: float = 300.0,
    shutdown_timeout_s: float = 30.0,
    first_byte_timeout_s: float = 30.0,
    stream_idle_timeout_s: float = 30.0,
    fleet_secret: str | None = None,
    profile: ProfileSource = cached_profile,
    registry: CollectorRegistry | None = None,
    gate_log_dir: Path | None = None,
) -> Gateway:
    """Wire the scheduling layer: backend, loads, demand, metrics, controller, dispatcher, and the
    validation gate's shadow traffic when the deployment has a `gate:` block.

    `fleet_secret`: the secret the backend gave the replicas (local_backend); None: replicas need none.
    `gate_log_dir`: where the gate appends its pairs and decisions as JSON lines (None: kept in memory only).
    """
    rng = rng or random.Random()
    backend = backend or LocalBackend(spawn=popen_spawner(default_log_dir()))
    registry = registry or CollectorRegistry(auto_describe=True)
    # A report older than a few ticks is stale: the replica stopped answering GET /load.
    inflight = InFlight(clock, report_max_age_s=max(5.0, 3 * deployment.interval_s))
    demand = DemandMeter()
    metrics = SchedulerMetrics(registry)
    controller = Controller(
        backend,
        deployment.pools(),
        clock,
        inflight.loads,
        primary=deployment.primary,
        demand=demand.rate,
        buffered=inflight.buffered.__getitem__,
        metrics=metrics,
        config=deployment.controller,
    )
    dispatcher = Dispatcher(
        backend,
        deployment.router(rng),
        BreakerBoard(deployment.breaker, clock),
        deployment.fallback_plan(),
        controller.weights,
        inflight,
        demand,
        metrics,
        rng,
        clock,
    )
    # An unresponsive replica is skipped until it answers GET /load again (tandem.gateway.loads).
    liveness = Liveness(
        on_declare=lambda replica_id: inflight.mark_unreachable(replica_id, for_s=math.inf),
        on_revive=inflight.mark_reachable,
    )
    shadow = None
    if deployment.gate is not None:
        if gate_log_dir is not None:
            gate_log_dir.mkdir(parents=True, exist_ok=True)
        shadow = GatewayShadow(
            deployment.gate, controller=controller, dispatcher=dispatcher, variants=deployment.variants, clock=clock,
            registry=registry, sample=rng.random,
            pairs_file=gate_log_dir / "gate-pairs.jsonl" if gate_log_dir is not None else None,
            decisions_file=gate_log_dir / "gate-decisions.jsonl" if gate_log_dir is not None else None,
        )  # fmt: skip
    return Gateway(
        deployment, backend, controller, dispatcher, inflight, demand, metrics, GatewayMetrics(registry), registry,
        variants=dict(deployment.variants), transport=transport, buffer_timeout_s=buffer_timeout_s,
        read_timeout_s=read_timeout_s, shutdown_timeout_s=shutdown_timeout_s,
        first_byte_timeout_s=first_byte_timeout_s, stream_idle_timeout_s=stream_idle_timeout_s,
        fleet_secret=fleet_secret, liveness=liveness, clock=clock, profile=profile, shadow=shadow,
        observer=Observers([shadow]) if shadow is not None else NO_OBSERVER,
    )  # fmt: skip


def default_log_dir(now: Callable[[], float] = time.time) -> Path:
    """Where replica logs go unless --log-dir says: one folder per gateway run under the user's cache."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now()))
    return cache_dir() / "logs" / f"gateway-{stamp}-{os.getpid()}"


def replica_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The gateway's environment minus its TANDEM_* settings: a replica gets its settings as flags.

    Without this a TANDEM_REPLICAS_MAX meant for the gateway would make every replica a gateway too.
    """
    settings = settings_environment(environ)
    return {k: v for k, v in environ.items() if k not in settings}


def local_backend(
    settings: Settings, log_dir: Path, environ: Mapping[str, str] | None = None, fleet_secret: str | None = None
) -> LocalBackend:
    """Replicas as local processes: logs under `log_dir`, ports from --replica-ports (or any free one),
    the fleet's secret in their environment."""
    ports = PortRange(*settings.replica_ports) if settings.replica_ports else find_free_port
    env = replica_environment(os.environ if environ is None else environ)
    if fleet_secret is not None:
        env[FLEET_SECRET_ENV] = fleet_secret
    return LocalBackend(
        spawn=popen_spawner(log_dir),
        ports=ports,
        base_env=env,
        # Longer than a replica's own drain (its --shutdown-timeout), so SIGKILL is the exception.
        kill_after_s=settings.shutdown_timeout + 10.0,
    )


def refuse_the_gateways_port(settings: Settings) -> None:
    """BackendError when the replicas' port range holds the gateway's own port: a replica could never
    take it (the gateway holds it), and a range of that port alone would never start one at all."""
    if settings.replica_ports is None or settings.port == 0:
        return
    low, high = settings.replica_ports
    if low <= settings.port <= high:
        raise BackendError(
            f"--replica-ports {low}-{high} holds the gateway's own port {settings.port} (--port): give the "
            "replicas a range without it"
        )


def choose_backend(
    settings: Settings,
    deployment: Deployment,
    log_dir: Path,
    environ: Mapping[str, str] | None = None,
    fleet_secret: str | None = None,
) -> tuple[Backend, str]:
    """The deployment's backend, and a line for the banner saying where replicas run; either way the
    replicas get `fleet_secret` in their environment.

    Ray (`tandem[ray]`) is imported only here and only for `backend: ray`. BackendError when Ray
    is missing or its cluster cannot be reached.
    """
    if deployment.backend.name != "ray":
        return local_backend(settings, log_dir, environ, fleet_secret), "local processes on this machine"
    from tandem.cluster.ray import ray_backend

    try:
        backend = ray_backend(
            deployment.backend.address, log_dir=str(log_dir), ports=settings.replica_ports,
            # What a replica's node must not pass on: the gateway's own TANDEM_* settings (as locally).
            unset_env=settings_variables(), kill_after_s=settings.shutdown_timeout + 10.0,
            extra_env={FLEET_SECRET_ENV: fleet_secret} if fleet_secret is not None else None,
        )  # fmt: skip
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "ray":
            raise
        raise BackendError("the ray backend needs Ray: pip install 'tandem[ray]'") from None
    return backend, f"Ray: {backend.description}"
