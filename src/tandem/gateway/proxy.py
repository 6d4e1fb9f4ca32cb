"""The proxy: one client request through the Dispatcher to a replica and back, with retries.

- Non-streaming responses are buffered whole, so a failure is always retryable.
- Streams: the replica's status and first chunk are read before the gateway commits its own 200;
  a failure before that is retried, a failure after it is resumed elsewhere from what the client
  has (tandem.gateway.resume), or else ends the stream with an error event and `data: [DONE]`
  (tandem.gateway.relay).
- Deadlines (tandem.gateway.liveness): a stream's first chunk within `first_byte_timeout_s`; a
  non-streaming answer, or a GET /health from its replica every `first_byte_timeout_s` meanwhile.
  A replica that misses one and does not answer its health check (or makes progress on none of
  its streams) is declared unresponsive and the request re-run elsewhere. A replica that does
  answer is fine: the late request alone is re-run once on another replica of its variant, else
  (or late there too) answered 504 `first_byte_timeout`; its neighbours and the breaker never hear of it.
- The body was checked and parsed at the edge (tandem.edge.bodies): what a replica would refuse
  as malformed never leaves the gateway, and a client's 4xx never counts against a replica.
- Replicas get the fleet's secret (the client's own Authorization stays here).
- No replica ready (a burst, a scale from zero): the request waits at the gateway (counted as
  buffered, which the policies read) until one is, for up to `buffer_timeout_s`, then gets 503. A
  client that leaves meanwhile is forgotten at once, and a draining gateway answers 503 at once.
- A client that leaves while its request is at a replica: the upstream request is closed, so the
  replica aborts it and frees its KV slot.
- What happens to each request is told to the gateway's observers as events (attempt, response,
  chunk, done or cancelled: tandem.gateway.observers); shadow traffic is one of them. Nothing
  here waits for an observer.
Nothing here knows how a replica serves: it forwards bytes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tandem.cluster.backend import ReplicaState
from tandem.edge.bodies import NO_BODY, parsed_body
from tandem.edge.errors import APIError
from tandem.edge.errors import error_response as api_error_response
from tandem.edge.streams import ClientDisconnected, until_disconnect
from tandem.gateway.kv_feed import kv_route
from tandem.gateway.liveness import RequestTimeout, Unresponsive
from tandem.gateway.metrics import NO_VARIANT
from tandem.gateway.observers import NO_REQUEST_OBSERVER, RequestObserver, estimate_prompt_tokens, prompt_text
from tandem.gateway.relay import Relay, RelayResponse, failure_kind
from tandem.gateway.resumer import TOKEN_IDS_HEADER, Resumer, health_probe
from tandem.gateway.tenant_app import fair_acquire
from tandem.gateway.upstream import Started
from tandem.gateway.wiring import Gateway
from tandem.schedule.dispatch import Target
from tandem.schedule.fallback import ErrorEvent, Fail, FailureKind, PassThrough, Retry, classify_status
from tandem.schedule.routers import RouteRequest

__all__ = ["REGION_HEADER", "CLIENT_CLOSED", "error_response", "proxy", "proxy_get"]

logger = logging.getLogger("tandem.gateway")

REGION_HEADER = "x-tandem-region"
CLIENT_CLOSED = 499  # nginx's status for "the client closed the connection first" (never sent; counted)
_FORWARDED = ("content-type", "accept", "x-request-id")  # not authorization: replicas get the fleet's secret
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
_WAKE_AT_LEAST_EVERY_S = 0.5  # a buffered request re-checks this often even if nothing announced a change


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return api_error_response(APIError(status, message, code=code, headers=headers))


def _usage(content: bytes) -> tuple[int, int]:
    try:
        usage = json.loads(content).get("usage") or {}
        return int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    except (ValueError, AttributeError, TypeError):
        return 0, 0


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
    variant = gw.fleet.controller.primary
    gw.fleet.inflight.buffered[variant] += 1
    gw.fleet.cold.waiting(gw.clock(), cold=not any(r.state is ReplicaState.READY for r in gw.fleet.backend.list()))
    try:
        deadline = gw.clock() + gw.buffer_timeout_s
        while not gw.draining and (left := deadline - gw.clock()) > 0:
            await gw.fleet.wait_for_change(min(left, _WAKE_AT_LEAST_EVERY_S))
            target = gw.dispatcher.pick(route)
            if target is not None:
                gw.fleet.cold.served(gw.clock())
                return target
        return None
    finally:  # also when the client left (this task is cancelled)
        gw.fleet.inflight.buffered[variant] -= 1
        if gw.fleet.inflight.buffered[variant] <= 0:
            del gw.fleet.inflight.buffered[variant]
        gw.fleet.cold.abandoned(still_waiting=gw.fleet.inflight.buffered.get(variant, 0))


async def proxy(gw: Gateway, request: Request, path: str) -> Response:
    """POST `path` (completions, chat) through a replica; a client that leaves first frees everything."""
    timing = _Timing(gw)
    body = await request.body()
    # A draining gateway answers 503 at once: nothing for an observer to see.
    seen = (
        NO_REQUEST_OBSERVER if gw.draining else gw.observer.request(path, parsed_body(request.scope), request.headers)
    )
    try:
        response = await until_disconnect(_serve(gw, request, path, body, timing, seen), request.receive)
    except ClientDisconnected:
        seen.cancelled()
        timing.finish(CLIENT_CLOSED)
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it
    if not isinstance(response, RelayResponse):  # a relay reports the stream's end itself
        timing.finish(response.status_code)
        _answered(seen, None, response.status_code, response.headers, bytes(response.body), gw.clock())
    return response


def _answered(seen: RequestObserver, variant: str | None, status: int, headers: Any, content: bytes, at: float) -> None:
    """A whole answer (not streamed) from `variant` (None: the gateway's own), told to the observers."""
    seen.response(status, headers, at)
    seen.chunk(content, at)
    seen.done(variant, at)


async def _serve(
    gw: Gateway, request: Request, path: str, body: bytes, timing: _Timing, seen: RequestObserver
) -> Response:
    if gw.draining:
        return error_response(503, "the gateway is shutting down and accepts no new requests", "shutting_down")
    payload = parsed_body(request.scope)  # checked and parsed at the edge, off the loop when large
    if payload is NO_BODY:
        payload = {}  # not JSON (another Content-Type) or empty: the replica answers with its own 400
    stream = isinstance(payload, dict) and bool(payload.get("stream"))
    prompt = prompt_text(payload)
    prompt_tokens = estimate_prompt_tokens(payload)  # rough: for streams (their usage is not always sent), budgets
    headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
    route = RouteRequest(region=request.headers.get(REGION_HEADER), prefix=prompt, prompt_tokens=prompt_tokens)
    kv_ids = None
    if gw.fleet.kv is not None:  # kv-aware: what each replica holds of this prompt (tandem.gateway.kv_feed)
        route, kv_ids = await kv_route(
            gw.upstream.client, gw.fleet.backend.list(), gw.fleet.kv, route, payload, gw.clock()
        )
    fair = gw.tenancy is not None and gw.tenancy.admission is not None  # the tenants' queue (tandem.gateway.admission)
    target = await (fair_acquire(gw, route, request.scope) if fair else _acquire(gw, route))
    if kv_ids is not None and target is not None:
        gw.fleet.kv.expect(target.replica_id, kv_ids, gw.clock())
    if target is None:
        if gw.draining:
            return error_response(503, "the gateway is shutting down and accepts no new requests", "shutting_down")
        return error_response(
            503, f"no replica became ready within {gw.buffer_timeout_s:g} s", "no_replica", {"Retry-After": "1"}
        )
    attempts = [target]
    late = 0  # attempts whose first byte was late on a replica that served its other requests
    while True:
        target = attempts[-1]
        upstream: httpx.Response | None = None
        content = b""
        seen.attempt(target.url, stream, gw.clock())
        sent = {**headers, **seen.headers()}
        probe = health_probe(gw, target)
        try:
            if stream:
                upstream, started = await gw.upstream.start_stream(
                    target.replica_id, target.url + path, body, {**sent, TOKEN_IDS_HEADER: "1"}, probe
                )
                if isinstance(started, Started):  # the first chunk came: commit our own 200 now
                    timing.first_byte(target.variant)
                    seen.response(upstream.status_code, upstream.headers, gw.clock())
                    seen.chunk(started.first, gw.clock())
                    relay = Relay(
                        gw, upstream, started.first, started.chunks, attempts, prompt_tokens, timing.finish, seen,
                        probe, Resumer(gw, path, payload, sent, route),
                    )  # fmt: skip
                    return RelayResponse(relay, upstream.status_code, _headers(upstream))
                content, kind = started
            else:
                upstream = await gw.upstream.answer(target.replica_id, target.url + path, body, sent, probe)
                content, kind = upstream.content, classify_status(upstream.status_code)
        except RequestTimeout as exc:  # this request alone is late: never its neighbours', nor the breaker's business
            gw.dispatcher.abandoned(target)
            late += 1
            nxt = None
            if late == 1:  # once elsewhere, in case it was the replica's queue; slow everywhere: not again
                exclude = frozenset(a.replica_id for a in attempts)
                nxt = gw.dispatcher.pick(replace(route, exclude=exclude), variant=target.variant)
            # A warning, rate-limited by the log's filter: clients choose how many of their requests are slow.
            logger.warning("attempt %d: %s; %s", len(attempts), exc, "retried elsewhere" if nxt else "answered 504")
            if nxt is not None:
                gw.requests.retries.labels(target.variant).inc()
                attempts.append(nxt)
                continue
            timing.first_byte(target.variant)
            return error_response(
                504,
                f"the model sent no first byte within {exc.seconds:g} s (the gateway's first_byte_timeout) on "
                f"{'any of ' + str(len(attempts)) + ' replicas' if len(attempts) > 1 else 'its replica'}; "
                "a request that holds its text back (a long stop string) or a slow logits processor can take "
                "longer: raise the timeout, or make the request lighter",
                "first_byte_timeout",
            )
        except (httpx.HTTPError, StopAsyncIteration, Unresponsive) as exc:
            if upstream is not None:
                await upstream.aclose()
            kind = FailureKind.UNREACHABLE if isinstance(exc, StopAsyncIteration) else failure_kind(exc)
        except BaseException:  # the client went away (cancelled) while we waited on the replica
            if upstream is not None:
                await upstream.aclose()
            gw.dispatcher.abandoned(target)
            raise
        if kind is None:
            gw.dispatcher.succeeded(target, *_usage(content))
            timing.first_byte(target.variant)
            _answered(seen, target.variant, upstream.status_code, upstream.headers, content, gw.clock())
            return Response(content, status_code=upstream.status_code, headers=_headers(upstream))
        decision = gw.dispatcher.failed(attempts, kind, first_byte_sent=False)
        # A client's own 4xx is its business, not the operator's: a scan of 404s must not write a line each.
        # A replica's failure is the operator's: a warning, which the log's filter rate-limits under a flood.
        level = logging.DEBUG if kind is FailureKind.CLIENT_ERROR else logging.WARNING
        logger.log(
            level, "attempt %d on %s failed (%s): %s", len(attempts), target.replica_id, kind, type(decision).__name__
        )
        if isinstance(decision, Retry):
            gw.requests.retries.labels(target.variant).inc()
            nxt = gw.dispatcher.pick(replace(route, exclude=decision.exclude), variant=decision.variant)
            if nxt is not None:
                attempts.append(nxt)
                continue
            return error_response(503, f"no replica of {decision.variant} could take the retry", "no_replica")
        timing.first_byte(target.variant)
        if isinstance(decision, PassThrough) and upstream is not None:
            _answered(seen, target.variant, upstream.status_code, upstream.headers, content, gw.clock())
            return Response(content, status_code=upstream.status_code, headers=_headers(upstream))
        message = decision.message if isinstance(decision, Fail | ErrorEvent) else "the request failed"
        return error_response(decision.status if isinstance(decision, Fail) else 503, message, "upstream_failed")


async def proxy_get(gw: Gateway, path: str, request: Request) -> Response:
    """Routes any ready replica answers alike (GET /v1/models, /version; POST /tokenize, /detokenize):
    the primary's replicas first (an external engine may lack vLLM's utility routes), no routing."""
    assert gw.upstream.client is not None
    headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED}
    body = await request.body() if request.method == "POST" else None
    ready = [r for r in gw.fleet.backend.list() if r.state is ReplicaState.READY]
    ready.sort(key=lambda r: r.variant != gw.fleet.controller.primary)
    for replica in ready:
        url = httpx.URL(replica.url + path)
        if url.raw_path.decode("ascii") != path:  # httpx resolved something (a dot segment): not the route asked for
            return error_response(
                404, f"no such endpoint: {path[:120]!r} is not a path this gateway serves", "not_found"
            )
        try:
            upstream = await gw.upstream.client.request(request.method, url, headers=headers, content=body)
        except httpx.HTTPError:
            continue
        return Response(upstream.content, status_code=upstream.status_code, headers=_headers(upstream))
    return error_response(503, "no replica is ready yet", "no_replica", {"Retry-After": "1"})
