"""The proxy: one client request through the Dispatcher to a replica and back, with retries.

- Non-streaming responses are buffered whole, so a failure is always retryable.
- Streams: the replica's status and first chunk are read before the gateway commits its own 200;
  a failure before that is retried, a failure after it ends the stream with an error event and
  `data: [DONE]`.
- No replica ready (a burst, a scale from zero): the request waits at the gateway (counted as
  buffered, which the policies read) until one is, for up to `buffer_timeout_s`, then gets 503. A
  client that leaves meanwhile is forgotten at once, and a draining gateway answers 503 at once.
- A client that leaves while its request is at a replica: the upstream request is closed, so the
  replica aborts it and frees its KV slot.
Nothing here knows how a replica serves: it forwards bytes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from tandem.cluster.backend import ReplicaState
from tandem.edge.errors import error_body
from tandem.edge.streams import SSE_DONE, ClientDisconnected, sse, until_disconnect
from tandem.gateway.metrics import NO_VARIANT
from tandem.gateway.wiring import Gateway
from tandem.schedule.dispatch import Target
from tandem.schedule.fallback import ErrorEvent, Fail, FailureKind, PassThrough, Retry, classify_status
from tandem.schedule.routers import RouteRequest

__all__ = ["REGION_HEADER", "CLIENT_CLOSED", "error_response", "proxy", "proxy_get"]

logger = logging.getLogger("tandem.gateway")

REGION_HEADER = "x-tandem-region"
CLIENT_CLOSED = 499  # nginx's status for "the client closed the connection first" (never sent; counted)
_FORWARDED = ("authorization", "content-type", "accept", "x-request-id")
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
_WAKE_AT_LEAST_EVERY_S = 0.5  # a buffered request re-checks this often even if nothing announced a change


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, code=code), status_code=status, headers=headers)


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


def _headers(upstream: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}


class _Timing:
    """One request's metrics: first byte once, finish once, labelled by the variant that answered."""

    def __init__(self, gw: Gateway) -> None:
        self.gw, self.arrived = gw, gw.clock()
        self.variant = NO_VARIANT

    def first_byte(self, variant: str) -> None:
        self.variant = variant
        self.gw.requests.first_byte(variant, self.gw.clock() - self.arrived)

    def finish(self, code: int) -> None:
        self.gw.requests.finished(self.variant, code, self.gw.clock() - self.arrived)


async def _acquire(gw: Gateway, route: RouteRequest) -> Target | None:
    """A replica for a new request; waits (buffered) while none is ready; None after the timeout or a drain."""
    target = gw.dispatcher.pick(route)
    if target is not None or gw.draining:
        return target
    variant = gw.controller.primary
    gw.inflight.buffered[variant] += 1
    try:
        deadline = gw.clock() + gw.buffer_timeout_s
        while not gw.draining and (left := deadline - gw.clock()) > 0:
            await gw.wait_for_change(min(left, _WAKE_AT_LEAST_EVERY_S))
            target = gw.dispatcher.pick(route)
            if target is not None:
                return target
        return None
    finally:  # also when the client left (this task is cancelled)
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
        attempts: list[Target], prompt_tokens: int, timing: _Timing,
    ) -> None:  # fmt: skip
        self.gw, self.upstream, self.first, self.chunks = gw, upstream, first, chunks
        self.attempts, self.prompt_tokens, self.timing = attempts, prompt_tokens, timing
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
            gw.requests.stream_errors.labels(target.variant).inc()
            logger.warning("stream from %s broke mid-way: %s", target.replica_id, exc)
            if isinstance(decision, ErrorEvent):
                yield sse(error_body(502, decision.message, code=decision.code)) + SSE_DONE
            return
        self.settled = True
        gw.dispatcher.succeeded(target, self.prompt_tokens, max(events - 1, 0))  # minus the [DONE] event

    async def close(self) -> None:
        if not self.settled:  # the client went away
            self.settled = True
            self.gw.dispatcher.abandoned(self.attempts[-1])
        await self.upstream.aclose()
        self.timing.finish(self.upstream.status_code)


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
    """POST `path` (completions, chat) through a replica; a client that leaves first frees everything."""
    timing = _Timing(gw)
    body = await request.body()
    try:
        response = await until_disconnect(_serve(gw, request, path, body, timing), request.receive)
    except ClientDisconnected:
        timing.finish(CLIENT_CLOSED)
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it
    if not isinstance(response, _RelayResponse):
        timing.finish(response.status_code)
    return response


async def _serve(gw: Gateway, request: Request, path: str, body: bytes, timing: _Timing) -> Response:
    if gw.draining:
        return error_response(503, "the gateway is shutting down and accepts no new requests", "shutting_down")
    try:
        payload = json.loads(body) if body else {}
    except ValueError:
        payload = {}  # the replica answers the client's bad JSON with its own 400
    stream = isinstance(payload, dict) and bool(payload.get("stream"))
    prompt = _prompt_text(payload)
    prompt_tokens = len(prompt) // 4  # a rough estimate for streams (their usage is not always sent)
    headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
    route = RouteRequest(region=request.headers.get(REGION_HEADER), prefix=prompt)
    target = await _acquire(gw, route)
    if target is None:
        if gw.draining:
            return error_response(503, "the gateway is shutting down and accepts no new requests", "shutting_down")
        return error_response(
            503, f"no replica became ready within {gw.buffer_timeout_s:g} s", "no_replica", {"Retry-After": "1"}
        )
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
                timing.first_byte(target.variant)
                relay = _Relay(gw, upstream, first, chunks, attempts, prompt_tokens, timing)
                return _RelayResponse(relay, upstream.status_code, _headers(upstream))
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
            timing.first_byte(target.variant)
            return Response(content, status_code=upstream.status_code, headers=_headers(upstream))
        decision = gw.dispatcher.failed(attempts, kind, first_byte_sent=False)
        logger.info("attempt %d on %s failed (%s): %s", len(attempts), target.replica_id, kind, type(decision).__name__)
        if isinstance(decision, Retry):
            gw.requests.retries.labels(target.variant).inc()
            nxt = gw.dispatcher.pick(replace(route, exclude=decision.exclude), variant=decision.variant)
            if nxt is not None:
                attempts.append(nxt)
                continue
            return error_response(503, f"no replica of {decision.variant} could take the retry", "no_replica")
        timing.first_byte(target.variant)
        if isinstance(decision, PassThrough) and upstream is not None:
            return Response(content, status_code=upstream.status_code, headers=_headers(upstream))
        message = decision.message if isinstance(decision, Fail | ErrorEvent) else "the request failed"
        return error_response(decision.status if isinstance(decision, Fail) else 503, message, "upstream_failed")


async def proxy_get(gw: Gateway, path: str, request: Request) -> Response:
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
        return Response(upstream.content, status_code=upstream.status_code, headers=_headers(upstream))
    return error_response(503, "no replica is ready yet", "no_replica", {"Retry-After": "1"})
