"""The gateway: `tandem serve --replicas-min/--replicas-max/--policy/--fallback/--deployment`.

One process in front of local replicas (each a plain `tandem serve` on a loopback port). Clients
see the same OpenAI API; the gateway picks a replica per request (the Dispatcher), proxies the
request with httpx, re-runs it elsewhere when it fails before the first byte reached the client
(another replica, or the fallback variant), and runs the Controller's loop in the background
(probe, scale, drain before stop). Nothing here knows how a replica serves: it only forwards bytes.

- Non-streaming responses are buffered whole, so a failure is always retryable.
- Streams: the replica's status and first chunk are read before the gateway commits its own 200;
  a failure before that is retried, a failure after it ends the stream with an error event.
- No replica ready (a burst, a scale from zero): the request waits at the gateway (counted as
  buffered, which the policies read) for up to `buffer_timeout_s`, then gets 503.

`/metrics` serves the gateway's registry (the scheduling layer's metrics); `/ready` is 200 once
the primary variant has a ready replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tandem.cluster.backend import Backend, ReplicaState
from tandem.cluster.local import LocalBackend, popen_spawner
from tandem.schedule.breaker import BreakerBoard
from tandem.schedule.controller import Controller
from tandem.schedule.deployment import Deployment
from tandem.schedule.dispatch import Dispatcher, Target
from tandem.schedule.fallback import ErrorEvent, Fail, FailureKind, PassThrough, Retry, classify_status
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.routers import RouteRequest
from tandem.schedule.traffic import DemandMeter, InFlight

__all__ = ["Gateway", "build_gateway", "create_gateway_app", "run_gateway", "REGION_HEADER"]

logger = logging.getLogger("tandem.gateway")

REGION_HEADER = "x-tandem-region"
_FORWARDED = ("authorization", "content-type", "accept", "x-request-id")
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


def _error(status: int, message: str, code: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def _prompt_text(payload: Any) -> str:
    """The request's prompt as text (for prefix-affinity routing and a rough demand estimate)."""
    if not isinstance(payload, dict):
        return ""
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    messages = payload.get("messages")
    if isinstance(messages, list):
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    return ""


def _usage(content: bytes) -> tuple[int, int]:
    try:
        usage = json.loads(content).get("usage") or {}
        return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    except (ValueError, AttributeError, TypeError):
        return 0, 0


def _failure_kind(exc: httpx.HTTPError) -> FailureKind:
    if isinstance(exc, (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)):
        return FailureKind.TIMEOUT
    return FailureKind.UNREACHABLE  # connect errors, resets, a process that died, a broken body


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
    transport: httpx.AsyncBaseTransport | None = None
    buffer_timeout_s: float = 60.0
    read_timeout_s: float = 300.0
    clock: Callable[[], float] = time.monotonic
    client: httpx.AsyncClient | None = None
    failed_ticks: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {"requests": 0, "errors": 0, "retries": 0})

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def ready(self) -> bool:
        return any(r.variant == self.controller.primary and r.state is ReplicaState.READY for r in self.backend.list())


def build_gateway(
    deployment: Deployment,
    backend: Backend | None = None,
    *,
    log_dir: str | Path | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
    transport: httpx.AsyncBaseTransport | None = None,
    buffer_timeout_s: float = 60.0,
    read_timeout_s: float = 300.0,
    registry: CollectorRegistry | None = None,
) -> Gateway:
    """Wire the scheduling layer: backend, in-flight counts, demand, metrics, controller, dispatcher."""
    rng = rng or random.Random()
    backend = backend or LocalBackend(spawn=popen_spawner(log_dir))
    inflight = InFlight(clock)
    demand = DemandMeter()
    metrics = SchedulerMetrics(registry or CollectorRegistry(auto_describe=True))
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
    return Gateway(
        deployment, backend, controller, dispatcher, inflight, demand, metrics,
        transport=transport, buffer_timeout_s=buffer_timeout_s, read_timeout_s=read_timeout_s, clock=clock,
    )  # fmt: skip


# --- the proxy ------------------------------------------------------------------------------------
async def _acquire(gw: Gateway, route: RouteRequest) -> Target | None:
    """A replica for a new request; waits (buffered) while none is ready, None after the timeout."""
    target = gw.dispatcher.pick(route)
    if target is not None:
        return target
    variant = gw.controller.primary
    gw.inflight.buffered[variant] += 1
    try:
        deadline = gw.clock() + gw.buffer_timeout_s
        while gw.clock() < deadline:
            await asyncio.sleep(0.05)
            target = gw.dispatcher.pick(route)
            if target is not None:
                return target
        return None
    finally:
        gw.inflight.buffered[variant] -= 1
        if gw.inflight.buffered[variant] <= 0:
            del gw.inflight.buffered[variant]


class _Relay:
    """The rest of a stream whose first chunk already came; a failure now ends it with an error event.

    Exactly one of succeeded / failed / abandoned is reported per attempt, and the upstream is
    closed, however the stream ends: `_RelayResponse` settles it even when the client left before
    the body was ever iterated (an async generator that never started runs no `finally`).
    """

    def __init__(
        self, gw: Gateway, upstream: httpx.Response, first: bytes, chunks: AsyncIterator[bytes],
        attempts: list[Target], prompt_tokens: int,
    ) -> None:  # fmt: skip
        self.gw, self.upstream, self.first, self.chunks = gw, upstream, first, chunks
        self.attempts, self.prompt_tokens = attempts, prompt_tokens
        self.settled = False

    async def body(self) -> AsyncIterator[bytes]:
        gw, target = self.gw, self.attempts[-1]
        events = self.first.count(b"data:")
        yield self.first
        try:
            async for chunk in self.chunks:
                events += chunk.count(b"data:")
                yield chunk
        except httpx.HTTPError as exc:
            self.settled = True
            decision = gw.dispatcher.failed(self.attempts, _failure_kind(exc), first_byte_sent=True)
            gw.counts["errors"] += 1
            logger.warning("stream from %s broke mid-way: %s", target.replica_id, exc)
            if isinstance(decision, ErrorEvent):
                yield decision.sse().encode()
            return
        self.settled = True
        gw.dispatcher.succeeded(target, self.prompt_tokens, max(events - 1, 0))  # minus the [DONE] event

    async def close(self) -> None:
        if not self.settled:  # the client went away
            self.settled = True
            self.gw.dispatcher.abandoned(self.attempts[-1])
        await self.upstream.aclose()


class _RelayResponse(StreamingResponse):
    def __init__(self, relay: _Relay, status_code: int, headers: dict[str, str]) -> None:
        super().__init__(relay.body(), status_code=status_code, headers=headers)
        self.relay = relay

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.relay.close()


async def proxy(gw: Gateway, request: Request, path: str) -> Response:
    body = await request.body()
    try:
        payload = json.loads(body) if body else {}
    except ValueError:
        payload = {}
    stream = isinstance(payload, dict) and bool(payload.get("stream"))
    prompt = _prompt_text(payload)
    prompt_tokens = len(prompt) // 4  # a rough estimate for streams (their usage is not always sent)
    headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
    route = RouteRequest(region=request.headers.get(REGION_HEADER), prefix=prompt)
    gw.counts["requests"] += 1
    target = await _acquire(gw, route)
    if target is None:
        gw.counts["errors"] += 1
        return _error(503, f"no replica became ready within {gw.buffer_timeout_s:g} s", "no_replica")
    attempts = [target]
    assert gw.client is not None
    while True:
        target = attempts[-1]
        upstream: httpx.Response | None = None
        content = b""
        try:
            upstream = await gw.client.send(
                gw.client.build_request("POST", target.url + path, content=body, headers=headers), stream=True
            )
            kind = classify_status(upstream.status_code)
            if kind is None and stream:
                chunks = upstream.aiter_bytes()
                first = b""
                while not first:  # the first bytes, before committing our own 200
                    first = await chunks.__anext__()
                out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
                relay = _Relay(gw, upstream, first, chunks, attempts, prompt_tokens)
                return _RelayResponse(relay, upstream.status_code, out_headers)
            content = await upstream.aread()
            await upstream.aclose()
        except (httpx.HTTPError, StopAsyncIteration) as exc:
            if upstream is not None:
                await upstream.aclose()
            kind = FailureKind.UNREACHABLE if isinstance(exc, StopAsyncIteration) else _failure_kind(exc)
        except BaseException:  # the client went away (cancelled) while we waited on the replica
            if upstream is not None:
                await upstream.aclose()
            gw.dispatcher.abandoned(target)
            raise
        if kind is None:
            gw.dispatcher.succeeded(target, *_usage(content))
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            return Response(content, status_code=upstream.status_code, headers=out_headers)
        decision = gw.dispatcher.failed(attempts, kind, first_byte_sent=False)
        logger.info("attempt %d on %s failed (%s): %s", len(attempts), target.replica_id, kind, type(decision).__name__)
        if isinstance(decision, Retry):
            gw.counts["retries"] += 1
            nxt = gw.dispatcher.pick(replace(route, exclude=decision.exclude), variant=decision.variant)
            if nxt is not None:
                attempts.append(nxt)
                continue
            gw.counts["errors"] += 1
            return _error(503, f"no replica of {decision.variant} could take the retry", "no_replica")
        if isinstance(decision, PassThrough) and upstream is not None:
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            return Response(content, status_code=upstream.status_code, headers=out_headers)
        gw.counts["errors"] += 1
        message = decision.message if isinstance(decision, Fail | ErrorEvent) else "the request failed"
        return _error(decision.status if isinstance(decision, Fail) else 503, message, "upstream_failed")


async def _any_ready(gw: Gateway, path: str, request: Request) -> Response:
    """GET routes (/v1/models) answered by any ready replica."""
    assert gw.client is not None
    headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
    for replica in gw.backend.list():
        if replica.state is not ReplicaState.READY:
            continue
        try:
            upstream = await gw.client.get(replica.url + path, headers=headers)
        except httpx.HTTPError:
            continue
        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
        return Response(upstream.content, status_code=upstream.status_code, headers=out_headers)
    return _error(503, "no replica is ready yet", "no_replica")


def _wait_for_replicas(backend: Backend, poll_s: float = 0.1) -> None:
    """Until every stopped replica has exited (a LocalBackend SIGKILLs stragglers after its grace)."""
    limit = time.monotonic() + getattr(backend, "kill_after_s", 0.0) + 5.0
    while getattr(backend, "stopping", None) and time.monotonic() < limit:
        time.sleep(poll_s)


# --- the app --------------------------------------------------------------------------------------
def create_gateway_app(gw: Gateway, *, api_key: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        gw.client = httpx.AsyncClient(
            transport=gw.transport,
            timeout=httpx.Timeout(connect=5.0, read=gw.read_timeout_s, write=30.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        stop = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                try:
                    await asyncio.to_thread(gw.controller.tick)
                except Exception:
                    gw.failed_ticks += 1
                    logger.exception("controller tick failed")
                try:
                    await asyncio.wait_for(stop.wait(), gw.deployment.interval_s)
                except TimeoutError:
                    pass

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            stop.set()
            await task
            close = getattr(gw.backend, "close", None)
            if close is not None:
                close()
            await asyncio.to_thread(_wait_for_replicas, gw.backend)
            await gw.client.aclose()

    app = FastAPI(title="tandem gateway", lifespan=lifespan)
    app.state.gateway = gw

    if api_key:
        from tandem.serve.auth import ApiKeyMiddleware

        app.add_middleware(ApiKeyMiddleware, api_key=api_key)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready", response_model=None)
    async def ready() -> Response:
        if gw.ready():
            return JSONResponse({"status": "ready", "primary": gw.controller.primary})
        return JSONResponse({"status": "starting", "primary": gw.controller.primary}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        for variant in {*gw.controller.pools, *gw.dispatcher.breakers.states}:
            gw.metrics.observe_breaker(variant, gw.dispatcher.breakers.mode(variant))  # open -> half-open by time
        return Response(generate_latest(gw.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> Response:
        return await _any_ready(gw, "/v1/models", request)

    @app.get("/v1/models/{model_id:path}", response_model=None)
    async def model(model_id: str, request: Request) -> Response:
        return await _any_ready(gw, f"/v1/models/{model_id}", request)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await proxy(gw, request, "/v1/completions")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        return await proxy(gw, request, "/v1/chat/completions")

    return app


def run_gateway(
    gw: Gateway, host: str, port: int, *, api_key: str | None = None, log_level: str = "info", access_log: bool = False
) -> int:
    """Serve the gateway until SIGTERM/SIGINT; the replicas are stopped on the way out."""
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("tandem").setLevel(log_level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per probe and per proxied request
    names = ", ".join(f"{p.variant.name} ({p.variant.recipe})" for p in gw.deployment.plans)
    logger.info(
        "tandem gateway on http://%s:%d: variants %s; primary %s, fallback %s, policy %s",
        host, port, names, gw.deployment.primary, gw.deployment.fallback, gw.deployment.policy_name,
    )  # fmt: skip
    app = create_gateway_app(gw, api_key=api_key)

    from tandem.serve.server import ExitZeroServer

    ExitZeroServer(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log, server_header=False)
    ).run()
    return 0
