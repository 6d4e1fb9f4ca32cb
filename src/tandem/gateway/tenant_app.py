"""Tenancy wired into a built gateway: `enable_tenancy` (the ledger, the limits, the fair queue and
the usage observer), `install_tenancy` (the edge middlewares and the admin routes on the app),
`tenancy_loop` (replica time settled every second, while the app runs) and `fair_acquire` (a
waiting request's turn, for the proxy).

Admin routes (admin tenants only):
- `GET /admin/tenants`: names, priorities, limits, key hash prefixes (never keys), in flight,
  queued, each tenant's virtual token counter;
- `POST /admin/tenants/reload`: read the tenants file again (as SIGHUP does); a bad file keeps the
  old tenants and answers 400 naming the problem;
- `GET /admin/usage?tenant=&model=&since=&until=&group_by=hour|day|minute`: the ledger's sums
  (since/until: ISO 8601 or Unix seconds), flushed first so a client's last request is in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.types import Scope

from tandem.cluster.backend import ReplicaState
from tandem.deployment.tenants import Tenants, TenantsError, hash_prefix
from tandem.edge.bodies import parsed_body
from tandem.edge.errors import APIError
from tandem.gateway.admission import FairAdmission
from tandem.gateway.fair_queue import FairQueue
from tandem.gateway.ledger import GROUPS, Ledger, moment_from
from tandem.gateway.observers import also_observe
from tandem.gateway.tenancy import Limiter, Tenancy
from tandem.gateway.tenant_edge import TenantAuthMiddleware, TenantLimitsMiddleware, scope_tenant
from tandem.gateway.usage import TenantMetrics, UsageObserver, estimate_prompt_tokens
from tandem.gateway.wiring import Gateway
from tandem.schedule.dispatch import Target
from tandem.schedule.routers import AdmissionCap, RouteRequest

__all__ = ["enable_tenancy", "fair_acquire", "install_tenancy", "tenancy_loop"]

logger = logging.getLogger("tandem.gateway")

SETTLE_EVERY_S = 1.0


def _cap(gw: Gateway, tenants: Tenants) -> int | None:
    """Requests a replica may hold before the rest wait in the fair queue; None: no fair queue (the
    anonymous tenant alone has nobody to be fair to: requests go to the replicas as without tenants)."""
    if tenants.source == "--api-key":
        return None
    if tenants.fairness.max_inflight_per_replica is not None:
        return tenants.fairness.max_inflight_per_replica
    primary = gw.fleet.variants.get(gw.deployment.primary)
    return primary.profile.max_slots if primary is not None and primary.profile is not None else None


def enable_tenancy(
    gw: Gateway, tenants: Tenants, ledger: Ledger, *, path: Path | None = None,
    wall: Callable[[], float] = time.time,
) -> Tenancy:  # fmt: skip
    """Give `gw` its tenants: limits, the fair queue (when replicas are capped), usage into `ledger`.

    A fleet of models (tandem.gateway.models): the tenants, their limits and budgets, the ledger and
    the metrics are one for the whole gateway; each model's pool has its own fair queue (its
    replicas are what its requests contend for) and its own usage observer (its variants' prices)."""
    metrics = TenantMetrics(gw.registry)
    tenancy = _attach(gw, Tenancy(tenants, ledger, Limiter(wall), None, path), metrics, wall)
    try:
        tenancy.restore_today()
    except Exception as exc:  # a ledger that cannot be read now still takes writes
        logger.warning("could not read today's usage back from %s: %s", ledger.where, exc)
    for part in gw.models.values():
        if part.dispatcher is gw.dispatcher:  # the first model: the gateway's own pieces
            part.tenancy, part.observer = tenancy, gw.observer
            continue
        own = _attach(part, dataclasses.replace(tenancy, admission=None, usage=None, on_reload=[], path=None),
                      metrics, wall)  # fmt: skip

        def follow(new: Tenants, own: Tenancy = own) -> None:
            own.tenants = new
            for hook in own.on_reload:
                hook(new)

        tenancy.on_reload.append(follow)
    return tenancy


def _attach(gw: Gateway, tenancy: Tenancy, metrics: TenantMetrics, wall: Callable[[], float]) -> Tenancy:
    """One model's pool: its fair queue in front of its dispatcher, its usage observer; `gw.tenancy`."""
    cap = [_cap(gw, tenancy.tenants)]
    admission = None
    if cap[0] is not None:
        queue = FairQueue(tenancy.tenants.fairness.prompt_weight, tenancy.tenants.fairness.output_weight)
        admission = tenancy.admission = FairAdmission(queue, gw.dispatcher, gw.clock)

        def limit() -> int | None:
            top = max(t.priority for t in tenancy.tenants.tenants)
            if cap[0] is None or admission.placing is None or admission.placing >= top:
                return cap[0]
            return max(1, cap[0] - tenancy.tenants.fairness.reserved_per_replica)

        gw.dispatcher.router = AdmissionCap(gw.dispatcher.router, limit)
        gw.dispatcher.on_release = admission.release_soon

    def refair(new: Tenants) -> None:
        if admission is not None:
            admission.queue.prompt_weight = new.fairness.prompt_weight
            admission.queue.output_weight = new.fairness.output_weight
            cap[0] = _cap(gw, new)

    tenancy.on_reload.append(refair)

    def urls() -> dict[str, str]:
        return {r.url: r.variant for r in gw.fleet.backend.list() if r.state is ReplicaState.READY}

    usage = UsageObserver(tenancy, metrics, lambda: gw.fleet.variants, urls, wall)
    tenancy.usage = usage
    gw.observer = also_observe(gw.observer, usage)
    gw.tenancy = tenancy
    return tenancy


async def fair_acquire(gw: Gateway, route: RouteRequest, scope: Scope) -> Target | None:
    """The request's replica in its turn (priority, then the tenant's counter); None past the queue timeout."""
    tenancy = gw.tenancy
    assert tenancy is not None and tenancy.admission is not None
    tenant = tenancy.tenant(scope_tenant(scope))
    name, priority, weight = (tenant.name, tenant.priority, tenant.weight) if tenant is not None else ("", 0, 1.0)
    variant = gw.fleet.controller.primary
    gw.fleet.inflight.buffered[variant] += 1  # waiting at the gateway: what the policies read as demand
    try:
        return await tenancy.admission.acquire(
            route, name, priority, estimate_prompt_tokens(parsed_body(scope)), weight, gw.buffer_timeout_s,
            lambda: gw.draining,
        )  # fmt: skip
    finally:
        gw.fleet.inflight.buffered[variant] -= 1
        if gw.fleet.inflight.buffered[variant] <= 0:
            del gw.fleet.inflight.buffered[variant]


async def tenancy_loop(gw: Gateway, stop: asyncio.Event) -> None:
    tenancy = gw.tenancy
    if tenancy is None:
        return
    pools = {id(p.tenancy): p.tenancy for p in [gw, *gw.parts()] if p.tenancy is not None}  # one per model
    observers: list[UsageObserver] = [t.usage for t in pools.values() if t.usage is not None]
    while not stop.is_set():
        for usage in observers:
            try:
                usage.settle()
            except Exception:
                logger.exception("settling replica time failed")
        try:
            await asyncio.wait_for(stop.wait(), SETTLE_EVERY_S)
        except TimeoutError:
            pass
    for usage in observers:
        usage.settle()
    await asyncio.to_thread(tenancy.ledger.flush)


def _when(value: str | None, name: str) -> float | None:
    try:
        return moment_from(value)
    except ValueError as exc:
        raise APIError(400, f"{name}={exc}", param=name, code="invalid_value") from None


def tenants_view(tenancy: Tenancy) -> dict[str, Any]:
    queue = tenancy.admission.queue if tenancy.admission is not None else None
    return {
        "source": tenancy.tenants.source,
        "reloaded_at": tenancy.reloaded_at,
        "ledger": tenancy.ledger.where,
        "fairness": dataclasses.asdict(tenancy.tenants.fairness),
        "tenants": [
            {
                "name": t.name, "keys": [hash_prefix(h) + "..." for h in t.key_hashes], "priority": t.priority,
                "weight": t.weight, "limits": dataclasses.asdict(t.limits), "budget": dataclasses.asdict(t.budget),
                "models": list(t.models) if t.models is not None else None, "admin": t.admin,
                "in_flight": tenancy.limiter.in_flight(t.name),
                "queued": queue.queued(t.name) if queue is not None else 0,
                "virtual_tokens": queue.counters.get(t.name, 0.0) if queue is not None else None,
            }
            for t in tenancy.tenants.tenants
        ],
    }  # fmt: skip


def _router(tenancy: Tenancy) -> APIRouter:
    router = APIRouter()

    @router.get("/admin/tenants")
    async def tenants() -> dict:
        return tenants_view(tenancy)

    @router.post("/admin/tenants/reload")
    async def reload() -> dict:
        try:
            await asyncio.to_thread(tenancy.reload)
        except TenantsError as exc:
            raise APIError(400, f"{exc}; the tenants in use are unchanged", code="invalid_tenants_file") from None
        return tenants_view(tenancy)

    @router.get("/admin/usage")
    async def usage(
        tenant: str | None = None, model: str | None = None, since: str | None = None, until: str | None = None,
        group_by: str = "day",
    ) -> dict:  # fmt: skip
        if group_by not in GROUPS:
            raise APIError(400, f"group_by={group_by[:40]!r}: one of {', '.join(GROUPS)}", param="group_by",
                           code="invalid_value")  # fmt: skip
        start, end = _when(since, "since"), _when(until, "until")
        await asyncio.to_thread(tenancy.ledger.flush)
        rows = await asyncio.to_thread(tenancy.ledger.query, tenant or None, model or None, start, end, group_by)
        return {"group_by": group_by, "since": start, "until": end, "rows": rows}

    return router


def install_tenancy(app: FastAPI, gw: Gateway) -> None:
    """The limits middleware (inside the body checks) and the admin routes; the auth middleware is
    `install_tenant_auth`'s (outside them)."""
    assert gw.tenancy is not None
    app.include_router(_router(gw.tenancy))
    app.add_middleware(TenantLimitsMiddleware, tenancy=gw.tenancy)


def install_tenant_auth(app: FastAPI, gw: Gateway) -> None:
    assert gw.tenancy is not None
    app.add_middleware(TenantAuthMiddleware, tenancy=gw.tenancy)
