"""Wiring: the scheduling layer's parts assembled into one `Gateway` of named pieces, which the app,
the proxy and the admin API share:

- `fleet` (tandem.gateway.fleet): the backend, the Controller, the in-flight and demand estimates,
  the scheduling metrics, the variants;
- `dispatcher` (tandem.schedule.dispatch): which replica serves a request, breakers, fallback;
- `upstream` (tandem.gateway.upstream): the HTTP client to replicas, its timeouts and liveness;
- `observer` (tandem.gateway.observers): told what happens to each request (shadow traffic is one; the
  capacity policy's demand feed another, with its admission around the router: tandem.gateway.slo_admission);
- `requests` (tandem.gateway.metrics): the client-facing request metrics.

Each fleet has its own secret (`new_fleet_secret`): the gateway sends it to its replicas on every
request, and hands it to them in their environment (FLEET_SECRET_ENV, never on a command line that
`ps` shows, never logged), so a replica's port is useless to anyone but its gateway. Where replicas
run (local processes, a Ray cluster) is tandem.cluster.choice's.

Side effects come in as arguments: the backend (LocalBackend, or a FakeBackend in tests), the
clock, the transport to replicas (httpx's, or a MockTransport/FaultyTransport in tests), the
profile source (a `tandem profile` child process, or a fake).
"""

from __future__ import annotations

import math
import os
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry

from tandem.cluster.backend import Backend
from tandem.cluster.external import FLEET_SECRET_ENV
from tandem.cluster.local import LocalBackend, popen_spawner
from tandem.deployment import Deployment, ProfileSource
from tandem.gateway.fleet import Fleet, PendingUse
from tandem.gateway.kv_index import KVIndex
from tandem.gateway.liveness import Liveness
from tandem.gateway.metrics import GatewayMetrics
from tandem.gateway.observers import NO_OBSERVER, Observer, Observers
from tandem.gateway.replica_metrics import ReplicaMetrics
from tandem.gateway.shadow import GatewayShadow
from tandem.gateway.slo_admission import feed_policy
from tandem.gateway.upstream import Upstream
from tandem.schedule.breaker import BreakerBoard
from tandem.schedule.controller import Controller
from tandem.schedule.dispatch import Dispatcher
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.profiles import cache_dir, cached_profile
from tandem.schedule.traffic import DemandMeter, InFlight

if TYPE_CHECKING:
    from tandem.gateway.tenancy import Tenancy

__all__ = ["FLEET_SECRET_ENV", "Gateway", "PendingUse", "build_gateway", "default_log_dir", "new_fleet_secret"]


def new_fleet_secret() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class Gateway:
    """Everything the gateway process holds, as named pieces; tests reach in (fleet.backend.pid, ...)."""

    deployment: Deployment
    fleet: Fleet
    dispatcher: Dispatcher
    upstream: Upstream
    requests: GatewayMetrics
    registry: CollectorRegistry
    clock: Callable[[], float] = time.monotonic
    observer: Observer = NO_OBSERVER
    shadow: GatewayShadow | None = None  # the validation gate's shadow traffic, when the deployment has a gate
    buffer_timeout_s: float = 60.0  # how long a request waits at the gateway for a replica
    shutdown_timeout_s: float = 30.0  # in-flight requests get this long after SIGTERM
    draining: bool = False  # SIGTERM: admitting nothing new; waiting requests get 503
    # A fleet of models (tandem.gateway.models): each model's own Gateway, by the name clients send;
    # empty for one model (this one serves every request). `model` is this one's name ("": the only one).
    models: dict[str, Gateway] = field(default_factory=dict)
    model: str = ""
    tenancy: Tenancy | None = None  # tenants, limits, fair queue, usage (tandem.gateway.tenant_app.enable_tenancy)
    replica_metrics: ReplicaMetrics | None = None  # the replicas' token, TTFT, KV series per variant

    def begin_drain(self) -> None:
        self.draining = True
        self.fleet.notify()
        for part in self.models.values():
            if part is not self:
                part.begin_drain()

    def parts(self) -> list[Gateway]:
        """Each model's Gateway (this one alone when it serves one model)."""
        return list(self.models.values()) or [self]


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
    max_resumes: int = 2,
    fleet_secret: str | None = None,
    profile: ProfileSource = cached_profile,
    registry: CollectorRegistry | None = None,
    gate_log_dir: Path | None = None,
) -> Gateway:
    """Wire the scheduling layer: backend, loads, demand, metrics, controller, dispatcher, and the
    validation gate's shadow traffic when the deployment has a `gate:` block.

    `fleet_secret`: the secret the backend gave the replicas (local_backend); None: replicas need none.
    `max_resumes`: how often one stream that breaks mid-way is resumed elsewhere (tandem.gateway.resumer).
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
    fleet = Fleet(backend, controller, inflight, demand, metrics, dict(deployment.variants), profile=profile)
    if deployment.router_name == "kv-aware":
        fleet.kv = KVIndex()  # fed by the replicas' KV events (tandem.gateway.kv_feed)
    upstream = Upstream(
        transport, read_timeout_s=read_timeout_s, first_byte_timeout_s=first_byte_timeout_s,
        stream_idle_timeout_s=stream_idle_timeout_s, fleet_secret=fleet_secret, liveness=liveness,
        max_resumes=max_resumes,
    )  # fmt: skip
    gateway = Gateway(
        deployment, fleet, dispatcher, upstream, GatewayMetrics(registry), registry, clock=clock,
        observer=Observers([shadow]) if shadow is not None else NO_OBSERVER, shadow=shadow,
        buffer_timeout_s=buffer_timeout_s, shutdown_timeout_s=shutdown_timeout_s,
        replica_metrics=ReplicaMetrics(registry, lambda: controller.pools),
    )  # fmt: skip
    feed_policy(gateway)  # capacity with a TTFT SLO: its admission and live demand (tandem.gateway.slo_admission)
    return gateway


def default_log_dir(now: Callable[[], float] = time.time) -> Path:
    """Where replica logs go unless --log-dir says: one folder per gateway run under the user's cache."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now()))
    return cache_dir() / "logs" / f"gateway-{stamp}-{os.getpid()}"
