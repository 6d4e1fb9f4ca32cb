"""The rest of a stream whose first chunk already reached the client: relayed chunk by chunk.

Once the gateway committed its own 200, a failure can no longer be retried: the stream ends with an
error event and `data: [DONE]`, whatever went wrong (the connection broke, the replica paused
longer than `stream_idle_timeout_s` and was declared unresponsive, or its stream ended without
its own `data: [DONE]`). A pause of this stream alone, on a replica that answers its health probe
and serves its other streams, ends this stream only (`stream_idle_timeout`), and counts against
neither the replica nor its variant's breaker (tandem.gateway.liveness).

Exactly one of succeeded / failed / abandoned is reported per attempt, and the upstream is closed,
however the stream ends: `RelayResponse` settles it even when the client left before the body was
ever iterated (an async generator that never started runs no `finally`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import httpx
from fastapi.responses import StreamingResponse

from tandem.edge.errors import error_body
from tandem.edge.streams import SSE_DONE, sse
from tandem.gateway.liveness import MID_STREAM, Probe, RequestTimeout, Unresponsive
from tandem.gateway.observers import NO_REQUEST_OBSERVER, RequestObserver
from tandem.gateway.wiring import Gateway
from tandem.schedule.dispatch import Target
from tandem.schedule.fallback import ErrorEvent, FailureKind

__all__ = ["Relay", "RelayResponse", "failure_kind"]

logger = logging.getLogger("tandem.gateway")


class StreamTruncated(Exception):
    """The replica's stream ended without `data: [DONE]`."""


def failure_kind(exc: BaseException) -> FailureKind:
    if isinstance(exc, (Unresponsive, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)):
        return FailureKind.TIMEOUT
    return FailureKind.UNREACHABLE  # connect errors, resets, a process that died, a broken body


class Relay:
    """`finish(status)` is called once the stream ended, however it ended (the request's metrics);
    `seen` is told of every chunk relayed and of the stream's end (tandem.gateway.observers; the first
    chunk is told by whoever read it)."""

    def __init__(
        self, gw: Gateway, upstream: httpx.Response, first: bytes, chunks: AsyncIterator[bytes],
        attempts: list[Target], prompt_tokens: int, finish: Callable[[int], None],
        seen: RequestObserver = NO_REQUEST_OBSERVER, probe: Probe | None = None,
    ) -> None:  # fmt: skip
        self.gw, self.upstream, self.first, self.chunks = gw, upstream, first, chunks
        self.attempts, self.prompt_tokens, self.finish, self.seen = attempts, prompt_tokens, finish, seen
        self.probe = probe  # the replica's health check, asked when this stream pauses too long
        self.settled = False

    async def body(self) -> AsyncIterator[bytes]:
        gw, target = self.gw, self.attempts[-1]
        events = self.first.count(b"data:")
        tail = self.first[-len(SSE_DONE) :]
        if tail == SSE_DONE:  # the whole answer came in one chunk
            self.seen.done(target.variant, gw.clock())
        yield self.first
        try:
            while True:
                async with gw.liveness.deadline(target.replica_id, gw.stream_idle_timeout_s, MID_STREAM, self.probe):
                    chunk = await anext(self.chunks, None)
                if chunk is None:
                    break
                gw.liveness.progress(target.replica_id)
                events += chunk.count(b"data:")
                tail = (tail + chunk)[-len(SSE_DONE) :]
                self.seen.chunk(chunk, gw.clock())
                if tail == SSE_DONE:  # the client has it all once this is sent (it may hang up at once)
                    self.seen.done(target.variant, gw.clock())
                yield chunk
            if tail != SSE_DONE:
                raise StreamTruncated("the replica's stream ended without data: [DONE]")
        except RequestTimeout as exc:  # this stream alone paused too long; the replica serves its others
            self.settled = True
            gw.dispatcher.abandoned(target)  # no failure of the variant: the breaker is not told
            gw.requests.stream_errors.labels(target.variant).inc()
            logger.warning("stream on %s cut: %s", target.replica_id, exc)  # rate-limited by the log's filter
            self.seen.done(target.variant, gw.clock(), error=f"the stream paused too long: {exc}")
            message = (
                f"the model sent nothing for {exc.seconds:g} s mid-stream (the gateway's stream_idle_timeout); "
                "the stream is cut, the replica is fine"
            )
            yield sse(error_body(504, message, code="stream_idle_timeout")) + SSE_DONE
            return
        except (httpx.HTTPError, Unresponsive, StreamTruncated) as exc:
            self.settled = True
            decision = gw.dispatcher.failed(self.attempts, failure_kind(exc), first_byte_sent=True)
            gw.requests.stream_errors.labels(target.variant).inc()
            logger.warning("stream from %s broke mid-way: %s", target.replica_id, exc)
            self.seen.done(target.variant, gw.clock(), error=f"the stream broke mid-way: {exc}")
            if isinstance(decision, ErrorEvent):
                message, code = decision.message, decision.code
            else:
                message, code = "the replica serving this request failed mid-stream", "replica_failed"
            yield sse(error_body(502, message, code=code)) + SSE_DONE
            return
        self.settled = True
        gw.dispatcher.succeeded(target, self.prompt_tokens, max(events - 1, 0))  # minus the [DONE] event
        self.seen.done(target.variant, gw.clock())  # the client has it all

    async def close(self) -> None:
        if not self.settled:  # the client went away
            self.settled = True
            self.gw.dispatcher.abandoned(self.attempts[-1])
            self.seen.cancelled()
        await self.upstream.aclose()
        self.finish(self.upstream.status_code)


class RelayResponse(StreamingResponse):
    def __init__(self, relay: Relay, status_code: int, headers: dict[str, str]) -> None:
        super().__init__(relay.body(), status_code=status_code, headers=headers)
        self.relay = relay

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.relay.close()
