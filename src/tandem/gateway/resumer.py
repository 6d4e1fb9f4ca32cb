"""The I/O side of resuming a broken stream (the decisions are tandem.gateway.resume's): where the
continuation goes and its first chunk, for the relay (tandem.gateway.relay) to go on with.

After a break the dispatcher decides as before a first byte (tandem.schedule.fallback, `resumable`):
another replica of the variant for a dead or draining one, the fallback variant for a failing or
timed-out one (its breaker told as for any failure); a stream that alone paused too long, on a
replica that serves its others, goes to another replica of its variant (the breaker is not told).
Each try counts: at most `max_resumes` per request (Upstream.max_resumes), then the stream ends
with an error event as it would have without resuming. A continuation that the next replica
refuses (past the context, a deadline) ends it the same way.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Any

import httpx

from tandem.edge.resume_wire import TOKEN_IDS_HEADER
from tandem.gateway.liveness import Probe, RequestTimeout, Unresponsive
from tandem.gateway.resume import StreamLedger, continuation
from tandem.gateway.upstream import Started
from tandem.gateway.wiring import Gateway
from tandem.schedule.dispatch import Target
from tandem.schedule.fallback import FailureKind, Retry
from tandem.schedule.routers import RouteRequest

__all__ = ["TOKEN_IDS_HEADER", "Resumed", "Resumer", "failure_kind", "health_probe"]

logger = logging.getLogger("tandem.gateway")


def failure_kind(exc: BaseException) -> FailureKind:
    if isinstance(exc, (Unresponsive, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)):
        return FailureKind.TIMEOUT
    return FailureKind.UNREACHABLE  # connect errors, resets, a process that died, a broken body


def health_probe(gw: Gateway, target: Target) -> Probe:
    """Whether `target`'s replica answers its health check (an external engine: its readiness path):
    asked when one of its requests is late (the proxy's first try and every continuation)."""
    known = gw.fleet.variants.get(target.variant)
    path = known.engine.ready_path if known is not None and known.engine is not None else "/health"
    return lambda: gw.upstream.answers_health(target.url + path)


@dataclass(frozen=True)
class Resumed:
    """The continuation's stream, started on `target`."""

    target: Target
    upstream: httpx.Response
    started: Started
    probe: Probe


class Resumer:
    """One streaming request's resumes: `after_break` when its stream broke, with what it relayed in `ledger`."""

    def __init__(self, gw: Gateway, path: str, payload: Any, headers: dict[str, str], route: RouteRequest) -> None:
        self.gw, self.path, self.payload, self.route = gw, path, payload, route
        self.headers = {**headers, TOKEN_IDS_HEADER: "1"}
        self.ledger = StreamLedger(chat=path.rstrip("/").endswith("chat/completions"))
        self.broken: list[Target] = []  # the replicas this stream broke on
        self.tries = 0

    def resumable(self, target: Target) -> bool:
        """Whether a continuation could be sent at all now (before the dispatcher is asked)."""
        if self.tries >= self.gw.upstream.max_resumes or self.ledger.finished:
            return False
        engine = self._engine(target)
        tandem = engine is None
        body, _ = continuation(self.payload, self.ledger, tandem, engine.metrics_adapter if engine else None)
        if body is None and tandem and self.gw.deployment.fallback is not None:  # the fallback may take text
            fallback = self.gw.fleet.variants.get(self.gw.deployment.fallback)
            adapter = fallback.engine.metrics_adapter if fallback and fallback.engine else None
            body, _ = continuation(self.payload, self.ledger, fallback is not None and adapter is None, adapter)
        return body is not None

    def _engine(self, target: Target) -> Any:
        known = self.gw.fleet.variants.get(target.variant)
        return known.engine if known is not None else None

    async def after_break(self, target: Target, kind: FailureKind | None, reason: str) -> Resumed | None:
        """`target`'s stream broke (`kind`: what the breaker hears; None: this stream alone paused too long,
        and its replica was told abandoned already). The continuation's stream, or None: end it as today.
        Every failed attempt is told to the dispatcher here; the caller tells nothing more."""
        gw = self.gw
        variant = target.variant
        while True:
            self.broken.append(target)
            left = self.tries < gw.upstream.max_resumes
            decision = None
            if kind is not None:
                decision = gw.dispatcher.failed(self.broken, kind, first_byte_sent=True, resumable=left)
            if not left:
                return None
            self.tries += 1
            exclude = frozenset(t.replica_id for t in self.broken)
            if decision is None:
                nxt = gw.dispatcher.pick(replace(self.route, exclude=exclude), variant=target.variant)
            elif isinstance(decision, Retry):
                nxt = gw.dispatcher.pick(replace(self.route, exclude=decision.exclude | exclude), decision.variant)
            else:
                return None
            if nxt is None:
                return None
            engine = self._engine(nxt)
            adapter = engine.metrics_adapter if engine is not None else None
            body, why = continuation(self.payload, self.ledger, engine is None, adapter)
            if body is None:
                logger.info("stream not resumed on %s: %s", nxt.replica_id, why)
                gw.dispatcher.abandoned(nxt)
                return None
            gw.requests.resumes.labels(variant, reason).inc()
            gw.requests.resumed_off[target.replica_id] += 1
            self.ledger.restart(text_continuation=engine is not None or self.ledger.ids is None)
            started = await self._start(nxt, body)
            if isinstance(started, Resumed):
                logger.info("stream resumed from %s on %s (%s)", target.replica_id, nxt.replica_id, reason)
                return started
            target, kind = nxt, started
            reason = started.value if started is not None else "stream_idle"

    async def _start(self, target: Target, body: dict[str, Any]) -> Resumed | FailureKind | None:
        """The continuation's first chunk from `target`, or how it failed (None: late on a live replica)."""
        gw = self.gw
        probe = health_probe(gw, target)
        upstream = None
        content = json.dumps(body, ensure_ascii=False).encode()
        try:
            upstream, started = await gw.upstream.start_stream(
                target.replica_id, target.url + self.path, content, self.headers, probe
            )
        except RequestTimeout:
            gw.dispatcher.abandoned(target)
            return None
        except (httpx.HTTPError, StopAsyncIteration, Unresponsive) as exc:
            return FailureKind.UNREACHABLE if isinstance(exc, StopAsyncIteration) else failure_kind(exc)
        except BaseException:
            gw.dispatcher.abandoned(target)
            raise
        if isinstance(started, Started):
            return Resumed(target, upstream, started, probe)
        _, kind = started
        return kind if kind is not None else FailureKind.SERVER_ERROR
