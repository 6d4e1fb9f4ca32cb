"""create_app: the FastAPI application: routes, error handlers, limits, auth, and background loading.

The model loads in a background thread once the app starts, so /health answers at once and /ready
turns 200 when the model is served. Loading is passed in (`load`), as are the clocks, so tests and
other front ends can build an app around any ServedModel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tandem.contracts import KV_EVENTS_PATH
from tandem.edge.auth import ApiKeyMiddleware
from tandem.edge.bodies import RequestBodyMiddleware
from tandem.edge.errors import install_error_handlers
from tandem.edge.keep_track import KEPT_TRACK_PATH
from tandem.edge.openapi import install_openapi
from tandem.edge.prometheus import HttpResponseCounter, metrics_response
from tandem.edge.settings import Settings
from tandem.serve.api_docs import SERVER_OPERATIONS
from tandem.serve.kept_tracks import build_kept_tracks_router
from tandem.serve.kv_events import build_kv_events_router
from tandem.serve.metrics import UNCOUNTED_PATHS
from tandem.serve.openai_api import build_router
from tandem.serve.served import ServedModel
from tandem.serve.state import ServerState
from tandem.serve.tokens_api import build_tokens_router

__all__ = ["FLEET_PROTECTED", "PROTECTED", "create_app", "describe_load_error"]

logger = logging.getLogger("tandem.serve")

# What an API key guards: the model's routes (GET /version, /health and /ready stay open, as in vLLM).
PROTECTED = ("/v1", "/tokenize", "/detokenize", KEPT_TRACK_PATH, KV_EVENTS_PATH)
FLEET_PROTECTED = (*PROTECTED, "/load", "/metrics", "/docs", "/redoc", "/openapi.json")


def describe_load_error(exc: BaseException) -> str:
    """One line for the log: the message of an expected error, the type too for an unexpected one."""
    from tandem.model import ModelLoadError
    from tandem.optimize import RecipeError

    if isinstance(exc, (ModelLoadError, RecipeError, ValueError, OSError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def create_app(
    config: Settings,
    load: Callable[[], ServedModel],
    *,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    on_ready: Callable[[ServedModel], None] | None = None,
    on_fatal: Callable[[str], None] | None = None,
) -> FastAPI:
    """An app serving what `load()` returns. `on_ready` runs once it is served; `on_fatal` if it fails."""
    state = ServerState(config=config, clock=clock, wall_clock=wall_clock)

    def loaded(served: ServedModel) -> None:
        if state.admission.draining:  # shut down while loading: nobody will serve it
            served.shutdown()
            return
        state.set_served(served)
        if on_ready is not None:
            on_ready(served)

    def failed(exc: BaseException) -> None:
        state.load_error = describe_load_error(exc)
        logger.error("cannot serve the model: %s", state.load_error)
        if on_fatal is not None:
            on_fatal(state.load_error)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def work() -> None:
            try:
                served = load()
            except BaseException as exc:  # reported, never raised into a dead thread
                logger.debug("model loading failed", exc_info=True)
                outcome, arg = failed, exc
            else:
                outcome, arg = loaded, served
            try:
                loop.call_soon_threadsafe(outcome, arg)
            except RuntimeError:  # the loop closed while loading
                if outcome is loaded:
                    arg.shutdown()

        threading.Thread(target=work, name="tandem-load", daemon=True).start()
        yield
        state.admission.draining = True
        if state.served is not None:
            await asyncio.to_thread(state.served.shutdown)

    app = FastAPI(
        title="tandem",
        summary="OpenAI-compatible completions and chat completions",
        lifespan=lifespan,
    )
    app.state.tandem = state
    install_error_handlers(app)
    app.include_router(build_router(state))
    app.include_router(build_tokens_router(state))
    app.include_router(build_kept_tracks_router(state.kept))
    app.include_router(build_kv_events_router(state))

    @app.get("/health")
    async def health() -> dict:
        """The process is alive (the model may still be loading)."""
        return {"status": "ok"}

    @app.get("/ready", response_model=None)
    async def ready() -> Response:
        """200 once the model is served; 503 while loading, after a failed load and while shutting down."""
        if state.ready:
            return JSONResponse({"status": "ready", "model": state.served.name, "recipe": state.served.recipe})
        status = "draining" if state.admission.draining else ("failed" if state.load_error else "loading")
        return JSONResponse({"status": status, "error": state.load_error}, status_code=503)

    @app.get("/load")
    async def load_report(request: Request) -> dict:
        """This replica's ReplicaLoad (running, waiting, KV fraction in use, healthy): what routers decide
        on; with its KV blocks' size and hash seed (the scheme of GET /kv/events' hashes)."""
        server = request.scope.get("server") or (config.host, config.port)
        return {**dataclasses.asdict(state.load(f"{server[0]}:{server[1]}")), **state.kv_scheme()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return metrics_response(state.metrics.registry)

    install_openapi(app, SERVER_OPERATIONS)
    # Starlette runs the last-added middleware first: the response counter, auth, then the body
    # checks, then the routes (so the counter sees the rejections of the other two).
    app.add_middleware(RequestBodyMiddleware, max_body_bytes=config.max_body_bytes, body_timeout_s=config.body_timeout)
    if config.fleet_secret is not None:
        # A replica of a gateway's fleet answers only that gateway (the user's key stays there):
        # everything but the liveness and readiness probes needs the fleet's secret.
        app.add_middleware(ApiKeyMiddleware, api_key=config.fleet_secret.get_secret_value(), protected=FLEET_PROTECTED)
    elif config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key, protected=PROTECTED)
    app.add_middleware(HttpResponseCounter, count=state.metrics.count_response, uncounted=UNCOUNTED_PATHS)
    return app
