"""The gateway's FastAPI app: the OpenAI routes (proxied), health, readiness, metrics, the admin API,
and the control loop in the background.

The control loop, once per `interval_s`: run one `Controller.tick()` (in a thread: probes block),
poll the replicas' GET /load (what routers and the next tick decide on), wake requests waiting for
a replica, and stop the process (through `on_fatal`) if the primary variant can never start. On
shutdown the loop stops, every replica is sent SIGTERM, and the gateway waits (bounded) for them.

`/ready` is 200 once the primary variant has a ready replica. `/metrics` serves the scheduling
layer's metrics and the gateway's request metrics from one registry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tandem.cluster.backend import Backend
from tandem.edge.auth import ApiKeyMiddleware
from tandem.edge.bodies import RequestBodyMiddleware
from tandem.edge.errors import install_error_handlers
from tandem.edge.headers import HeaderLimitMiddleware
from tandem.edge.openapi import Operation, install_openapi
from tandem.edge.paths import CanonicalPathMiddleware
from tandem.edge.prometheus import metrics_response
from tandem.gateway.admin import build_admin_router
from tandem.gateway.loads import poll_loads
from tandem.gateway.make_room import RoomMaker
from tandem.gateway.model_backend import shared_backend
from tandem.gateway.models import all_ready, model_cards, requested_model, route, warmest
from tandem.gateway.models_admin import build_models_admin_router
from tandem.gateway.proxy import proxy, proxy_get
from tandem.gateway.replica_metrics import scrape_replica_metrics
from tandem.gateway.tenant_app import install_tenancy, install_tenant_auth, tenancy_loop
from tandem.gateway.wiring import Gateway

__all__ = ["control_loop", "create_gateway_app", "stop_replicas"]

logger = logging.getLogger("tandem.gateway")

_POST = (400, 401, 404, 408, 413, 429, 500, 503)
GATEWAY_OPERATIONS: dict[tuple[str, str], Operation] = {
    ("/v1/completions", "post"): Operation(stream=True, errors=_POST),
    ("/v1/chat/completions", "post"): Operation(stream=True, errors=_POST),
    ("/v1/models", "get"): Operation(errors=(401, 500, 503)),
    ("/v1/models/{model_id}", "get"): Operation(errors=(401, 404, 500, 503)),
    ("/metrics", "get"): Operation(ok_media="text/plain", errors=(500,)),
    ("/tokenize", "post"): Operation(errors=(400, 401, 404, 408, 413, 500, 503)),
    ("/detokenize", "post"): Operation(errors=(400, 401, 404, 408, 413, 500, 503)),
    ("/version", "get"): Operation(errors=(500, 503)),
    ("/health", "get"): Operation(errors=(500,)),
    ("/ready", "get"): Operation(errors=(500,), also={503: None}),
    ("/admin/replicas", "get"): Operation(errors=(401, 404, 500)),
    ("/admin/rollout", "get"): Operation(errors=(400, 401, 404, 500)),
    ("/admin/gate", "get"): Operation(errors=(400, 401, 404, 500)),
    ("/admin/gate/promote", "post"): Operation(errors=(400, 401, 404, 409, 500)),
    ("/admin/use", "post"): Operation(errors=(400, 401, 404, 408, 409, 413, 500)),
    ("/admin/models", "get"): Operation(errors=(401, 500)),
}
REPLICA_EXIT_WAIT_S = 15.0  # at shutdown; replicas still running later leave on their own (tandem.edge.lifeline)


async def _tick_model(gw: Gateway, on_fatal: Callable[[str], None]) -> None:
    """One model's tick: its controller, its gate, its replicas' loads, its waiting requests woken."""
    try:
        await asyncio.to_thread(gw.fleet.controller.tick)
    except Exception:
        logger.exception("controller tick failed")
    if gw.shadow is not None:  # the gate judges on the same tick (its bootstrap runs off the loop)
        try:
            await asyncio.to_thread(gw.shadow.tick, gw.clock())
        except Exception:
            logger.exception("the gate's tick failed")
    # Right after the tick, so a replica that just became ready is described by its own report at once.
    await poll_loads(gw.fleet, gw.upstream)
    gw.fleet.notify()
    if gw.replica_metrics is not None:  # their token, TTFT and KV series, per variant on our /metrics
        replicas = gw.fleet.backend.list()
        await scrape_replica_metrics(gw.replica_metrics, replicas, gw.upstream.client, gw.upstream.load_timeout_s)
    if gw.fleet.controller.fatal is not None and gw.fleet.fatal is None:
        gw.fleet.fatal = gw.fleet.controller.fatal
        on_fatal(gw.fleet.fatal)


async def control_loop(gw: Gateway, stop: asyncio.Event, on_fatal: Callable[[str], None]) -> None:
    """Every model's tick, once per interval (the shortest of the models'). With several models one
    that can never start is reported (GET /admin/models) and the others serve on: only a single
    model's failure ends the process."""
    interval_s = min(part.deployment.interval_s for part in gw.parts())
    room = RoomMaker() if gw.models else None  # scales idle models down for one a request waits for
    while not stop.is_set():
        if room is not None:  # first, so the models' ticks act on it at once (a cap lifted, a model drained)
            try:
                await asyncio.to_thread(room.tick, gw, gw.clock())
            except Exception:
                logger.exception("making room failed")
        for part in gw.parts():
            await _tick_model(part, on_fatal if not gw.models else _model_failed(part))
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass


def _model_failed(part: Gateway) -> Callable[[str], None]:
    return lambda message: logger.error("model %s cannot serve: %s", part.model, message)


def stop_replicas(backend: Backend, wait_s: float = REPLICA_EXIT_WAIT_S, poll_s: float = 0.1) -> list[str]:
    """SIGTERM every replica and wait (at most `wait_s`) until their processes exited. Returns those still up."""
    left = {r.replica_id for r in backend.list()}
    for replica_id in left:
        backend.stop(replica_id)
    deadline = time.monotonic() + wait_s
    while left and time.monotonic() < deadline:
        left -= {e.replica.replica_id for e in backend.exits()}
        if left:
            time.sleep(poll_s)
    if left:
        logger.warning("replicas %s still shutting down; they exit on their own once the gateway is gone", sorted(left))
    return sorted(left)


def create_gateway_app(
    gw: Gateway,
    *,
    api_key: str | None = None,
    max_body_bytes: int = 1 << 20,
    body_timeout_s: float = 30.0,
    max_header_bytes: int = 16384,
    on_fatal: Callable[[str], None] | None = None,
) -> FastAPI:
    """The app around `gw`. `on_fatal(message)` is called once if the primary variant can never start.

    Before anything else, the request line and headers are bounded (431 past `max_header_bytes`,
    tandem.edge.headers) and the path must be canonical (404 otherwise, tandem.edge.paths), so the
    key check, the routes and the proxy all see one path. Then the same body checks as a replica's
    (size, time, JSON), so a request a replica would refuse never leaves the gateway, and the proxy
    reads the body parsed once, off the loop.
    """

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for part in gw.parts():
            client = part.upstream.open()  # every request to a replica carries the fleet's secret
            if part.shadow is not None:
                part.shadow.start(client)
        stop = asyncio.Event()
        task = asyncio.create_task(control_loop(gw, stop, on_fatal or (lambda message: None)))
        tenancy = asyncio.create_task(tenancy_loop(gw, stop))  # replica time per tenant; the ledger flushed
        try:
            yield
        except asyncio.CancelledError:
            # uvicorn skipped the shutdown (a second signal) and is tearing the loop down: no traceback;
            # whoever runs the server stops the replicas (run_gateway does).
            task.cancel()
            tenancy.cancel()
            return
        stop.set()
        await task
        await tenancy
        for part in gw.parts():
            if part.shadow is not None:
                await part.shadow.aclose()
        await asyncio.to_thread(stop_replicas, shared_backend(gw.fleet.backend))
        for part in gw.parts():
            await part.upstream.aclose()

    app = FastAPI(
        title="tandem gateway", summary="Routes, autoscales and falls back over tandem replicas", lifespan=lifespan
    )
    app.state.gateway = gw
    install_error_handlers(app)
    app.include_router(build_admin_router(gw))
    app.include_router(build_models_admin_router(gw))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready", response_model=None)
    async def ready() -> Response:
        """200 once the primary variant has a ready replica; 503 while starting and while draining."""
        if all_ready(gw) and not gw.draining:
            return JSONResponse({"status": "ready", "primary": gw.fleet.controller.primary})
        status = "draining" if gw.draining else ("failed" if gw.fleet.fatal else "starting")
        return JSONResponse(
            {"status": status, "primary": gw.fleet.controller.primary, "error": gw.fleet.fatal}, status_code=503
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        # Open -> half-open by time; a variant that left the deployment (retired, rolled over) loses its series.
        for part in gw.parts():
            pools = part.fleet.controller.pools
            part.fleet.metrics.observe_breakers({v: part.dispatcher.breakers.mode(v) for v in pools})
            part.requests.observe_buffered(pools, part.fleet.inflight.buffered)
        return metrics_response(gw.registry)

    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> Response:
        if gw.models:  # many models: the gateway knows them all, cold ones too
            return JSONResponse(await asyncio.to_thread(model_cards, gw))
        return await proxy_get(gw, "/v1/models", request)

    @app.get("/v1/models/{model_id:path}", response_model=None)
    async def model(model_id: str, request: Request) -> Response:
        if gw.models:
            route(gw, model_id)  # 404 model_not_found unless served
            cards = await asyncio.to_thread(model_cards, gw)
            return JSONResponse(next(c for c in cards["data"] if c["id"] == model_id))
        # Encoded again as the client sent it: an id with a control character, "?" or "#" is the replica's 404.
        return await proxy_get(gw, f"/v1/models/{quote(model_id, safe='/')}", request)

    # vLLM's utility routes, answered by a replica (tokens are the model's business).
    @app.post("/tokenize", response_model=None)
    async def tokenize(request: Request) -> Response:
        return await proxy_get(route(gw, requested_model(request)), "/tokenize", request)

    @app.post("/detokenize", response_model=None)
    async def detokenize(request: Request) -> Response:
        return await proxy_get(route(gw, requested_model(request)), "/detokenize", request)

    @app.get("/version", response_model=None)
    async def version(request: Request) -> Response:
        return await proxy_get(warmest(gw), "/version", request)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await proxy(route(gw, requested_model(request)), request, "/v1/completions")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        return await proxy(route(gw, requested_model(request)), request, "/v1/chat/completions")

    install_openapi(app, GATEWAY_OPERATIONS)
    # Starlette runs the last-added middleware first: header size, the path, auth, the body checks, the routes.
    if gw.tenancy is not None:  # the tenants' limits see the parsed body (tandem.gateway.tenant_edge)
        install_tenancy(app, gw)
    app.add_middleware(RequestBodyMiddleware, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)
    if gw.tenancy is not None:  # keys -> tenants (an --api-key is the anonymous tenant's)
        install_tenant_auth(app, gw)
    elif api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, protected=("/v1", "/admin", "/tokenize", "/detokenize"))
    app.add_middleware(CanonicalPathMiddleware)
    app.add_middleware(HeaderLimitMiddleware, max_header_bytes=max_header_bytes)
    return app
