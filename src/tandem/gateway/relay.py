"""The rest of a stream whose first chunk already reached the client: relayed chunk by chunk.

Once the gateway committed its own 200, a failure can no longer be retried: it is resumed on another
replica from what the client already has (tandem.gateway.resume, .resumer), the client seeing one
stream; where it cannot be (out of resumes, nothing to continue, a request a continuation cannot
carry), the stream ends with an error event and `data: [DONE]`, whatever went wrong (the connection
broke, the replica paused longer than `stream_idle_timeout_s` and was declared unresponsive, or its stream ended without
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
from tandem.gateway.resume import error_kind
from tandem.gateway.resumer import Resumed, Resumer, failure_kind
from tandem.gateway.wiring import Gateway
from tandem.schedule.dispatch import Target
from tandem.schedule.fallback import ErrorEvent, FailureKind

__all__ = ["Relay", "RelayResponse", "failure_kind"]

logger = logging.getLogger("tandem.gateway")


class StreamTruncated(Exception):
    """The replica's stream ended without `data: [DONE]`."""


class ReplicaErrorEvent(Exception):
    """The replica's stream sent an error event mid-way (held back while the stream may be resumed)."""

    def __init__(self, event: dict) -> None:
        super().__init__(str((event.get("error") or {}).get("message", event))[:300])
        self.event = event


class Relay:
    """`finish(status)` is called once the stream ended, however it ended (the request's metrics);
    `seen` is told of every chunk relayed and of the stream's end (tandem.gateway.observers; the first
    chunk is told by whoever read it). With `resume` a stream that breaks is resumed elsewhere from
    what it relayed (tandem.gateway.resumer), the client seeing one stream."""

    def __init__(
        self, gw: Gateway, upstream: httpx.Response, first: bytes, chunks: AsyncIterator[bytes],
        attempts: list[Target], prompt_tokens: int, finish: Callable[[int], None],
        seen: RequestObserver = NO_REQUEST_OBSERVER, probe: Probe | None = None, resume: Resumer | None = None,
    ) -> None:  # fmt: skip
        self.gw, self.upstream, self.first, self.chunks = gw, upstream, first, chunks
        self.attempts, self.prompt_tokens, self.finish, self.seen = attempts, prompt_tokens, finish, seen
        self.probe = probe  # the replica's health check, asked when this stream pauses too long
        self.resume = resume
        self.settled = False

    def _filter(self, chunk: bytes) -> bytes:
        """What of the replica's bytes to relay (all, without resuming); raises on its error event."""
        if self.resume is None:
            return chunk
        ledger = self.resume.ledger
        out = ledger.feed(chunk)
        if ledger.error is not None:
            self.held = out
            raise ReplicaErrorEvent(ledger.error)
        return out

    async def _switch(self, resumed: Resumed) -> bytes:
        """Go on with the continuation's stream; its first bytes to relay."""
        await self.upstream.aclose()
        self.upstream, self.chunks, self.probe = resumed.upstream, resumed.started.chunks, resumed.probe
        self.attempts.append(resumed.target)
        self.settled = False
        return resumed.started.first

    async def body(self) -> AsyncIterator[bytes]:
        gw = self.gw
        pending, events, tail = self.first, 0, b""
        while True:
            target = self.attempts[-1]
            self.held = b""
            try:
                relayed = self._filter(pending)
                events += relayed.count(b"data:")
                tail = (tail + relayed)[-len(SSE_DONE) :]
                if tail == SSE_DONE:  # the whole answer came in one chunk
                    self.seen.done(target.variant, gw.clock())
                if relayed:
                    if len(self.attempts) > 1:  # a continuation's first (the proxy told the stream's own)
                        self.seen.chunk(relayed, gw.clock())
                    yield relayed
                while tail != SSE_DONE:
                    async with gw.upstream.liveness.deadline(
                        target.replica_id, gw.upstream.stream_idle_timeout_s, MID_STREAM, self.probe
                    ):
                        chunk = await anext(self.chunks, None)
                    if chunk is None:
                        break
                    gw.upstream.liveness.progress(target.replica_id)
                    relayed = self._filter(chunk)
                    if not relayed:
                        continue
                    events += relayed.count(b"data:")
                    tail = (tail + relayed)[-len(SSE_DONE) :]
                    self.seen.chunk(relayed, gw.clock())
                    if tail == SSE_DONE:  # the client has it all once this is sent (it may hang up at once)
                        self.seen.done(target.variant, gw.clock())
                    yield relayed
                if tail != SSE_DONE:
                    raise StreamTruncated("the replica's stream ended without data: [DONE]")
            except RequestTimeout as exc:  # this stream alone paused too long; the replica serves its others
                self.settled = True
                gw.dispatcher.abandoned(target)  # no failure of the variant: the breaker is not told
                if (resumed := await self._resumed(target, None, "stream_idle")) is not None:
                    pending = await self._switch(resumed)
                    continue  # (nothing was held: only an error event holds bytes back)
                gw.requests.stream_errors.labels(target.variant).inc()
                logger.warning("stream on %s cut: %s", target.replica_id, exc)  # rate-limited by the log's filter
                self.seen.done(target.variant, gw.clock(), error=f"the stream paused too long: {exc}")
                message = (
                    f"the model sent nothing for {exc.seconds:g} s mid-stream (the gateway's stream_idle_timeout); "
                    "the stream is cut, the replica is fine"
                )
                yield sse(error_body(504, message, code="stream_idle_timeout")) + SSE_DONE
                return
            except (httpx.HTTPError, Unresponsive, StreamTruncated, ReplicaErrorEvent) as exc:
                self.settled = True
                kind = error_kind(exc.event) if isinstance(exc, ReplicaErrorEvent) else failure_kind(exc)
                decision = None  # a resumer that tried tells the dispatcher itself
                if self.held:  # the events before the replica's error event are the answer's
                    self.seen.chunk(self.held, gw.clock())
                    yield self.held
                    self.held = b""
                if self.resume is not None and self.resume.ledger.finished:  # it broke after the answer's end
                    gw.dispatcher.failed(self.attempts, kind, first_byte_sent=True)
                    self.seen.done(target.variant, gw.clock())
                    yield SSE_DONE
                    return
                if self.resume is not None and self.resume.resumable(target):
                    if (resumed := await self.resume.after_break(target, kind, kind.value)) is not None:
                        pending = await self._switch(resumed)
                        continue
                else:
                    decision = gw.dispatcher.failed(self.attempts, kind, first_byte_sent=True)
                gw.requests.stream_errors.labels(target.variant).inc()
                logger.warning("stream from %s broke mid-way: %s", target.replica_id, exc)
                self.seen.done(target.variant, gw.clock(), error=f"the stream broke mid-way: {exc}")
                if isinstance(exc, ReplicaErrorEvent):  # the replica's own words, as it sent them
                    yield sse(exc.event) + SSE_DONE
                    return
                if isinstance(decision, ErrorEvent):
                    message, code = decision.message, decision.code
                else:  # as after_failure words it (the resumer asked it for a resumable stream's next step)
                    message, code = f"the replica serving this request failed mid-stream ({kind})", f"replica_{kind}"
                yield sse(error_body(502, message, code=code)) + SSE_DONE
                return
            break
        self.settled = True
        gw.dispatcher.succeeded(target, self.prompt_tokens, max(events - 1, 0))  # minus the [DONE] event
        self.seen.done(target.variant, gw.clock())  # the client has it all

    async def _resumed(self, target: Target, kind: FailureKind | None, reason: str) -> Resumed | None:
        if self.resume is None or not self.resume.resumable(target):
            return None
        return await self.resume.after_break(target, kind, reason)

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
