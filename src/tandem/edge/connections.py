"""Connections that cannot lock a server out: a cap on open connections and a deadline for headers.

What uvicorn and h11 give, and are used (tandem.edge.server sets them from Settings): the listen
`backlog`, `timeout_keep_alive` (an idle keep-alive connection closes), and h11's
`max_incomplete_event_size` (a request line and headers larger than it get 400).

What they lack, and is here: uvicorn arms no timer on a connection before its first request
completes, so a client that connects and sends nothing, or half a request line, holds a
connection (and a file descriptor) for ever; about 20,000 of them exhaust the process's
descriptors and no new client gets in. uvicorn's `limit_concurrency` does not help: it counts
those idle connections too and answers *new* requests with 503 while they stay, which hands a
flood exactly the lockout it wants. So `ConnectionGuard`, through a subclass of uvicorn's h11
protocol, keeps two rules:

- header deadline: a connection waiting for a request's headers (a new one, or a keep-alive one
  after its last response) closes after `header_timeout_s`;
- cap: at most `max_connections` open; a new connection over the cap closes the oldest one still
  waiting for headers (idle keep-alive or half-sent: neither has a request running), or, when
  every connection has a request running, is itself answered 503 and closed;
- header size: a request line and headers still arriving that are past `max_header_bytes` get
  431 with an OpenAI-style body (h11 would answer a plain-text 400); a block that arrived whole is
  measured by tandem.edge.headers, with the same answer.

Requests in progress are never cut by either rule (their bodies have their own deadline,
tandem.edge.bodies). What the guard closes is logged as one summary line per interval at most.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import resource
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from tandem.edge.errors import error_body
from tandem.edge.headers import headers_too_large

__all__ = ["ConnectionGuard", "descriptor_budget"]

logger = logging.getLogger("tandem.http")

_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


def descriptor_budget(wanted: int, per_connection: int = 1, reserve: int = 256) -> int:
    """How many connections fit in this process's file descriptors (the soft limit raised to the hard one).

    `per_connection`: descriptors one client connection costs (the gateway: its own and one to a replica).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, (soft - reserve) // per_connection))


class ConnectionGuard:
    """One server's connections. `protocol` is what uvicorn.Config(http=...) takes."""

    def __init__(
        self,
        max_connections: int,
        header_timeout_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        report_every_s: float = 10.0,
        max_header_bytes: int | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes
        self.clock = clock
        self.report_every_s = report_every_s
        self.open: set[Any] = set()
        self.waiting: OrderedDict[Any, asyncio.TimerHandle | None] = OrderedDict()  # oldest first
        self.counts = {"timed_out": 0, "shed": 0, "refused": 0, "too_large": 0}  # since the last report
        self.totals = dict(self.counts)
        self._reported_at = -math.inf  # the first event is reported at once
        guard = self

        class GuardedH11Protocol(H11Protocol):
            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                super().connection_made(transport)
                guard.opened(self)

            def data_received(self, data: bytes) -> None:
                if guard.headers_overflow(self, data):
                    return
                super().data_received(data)
                if _in_request(self):
                    guard.busy(self)

            def on_response_complete(self) -> None:
                super().on_response_complete()
                if not self.transport.is_closing():
                    guard.busy(self) if _in_request(self) else guard.idle(self)

            def connection_lost(self, exc: Exception | None) -> None:
                guard.closed(self)
                super().connection_lost(exc)

        self.protocol = GuardedH11Protocol

    # --- what connections report ---------------------------------------------------------------
    def opened(self, conn: Any) -> None:
        self.open.add(conn)
        self.idle(conn)
        while len(self.open) > self.max_connections:
            victim = next(iter(self.waiting), None)
            if victim is None or victim is conn:  # every other connection has a request running
                self._refuse(conn)
                return
            self._close(victim, "shed")

    def idle(self, conn: Any) -> None:
        """`conn` waits for a request's headers: it has header_timeout_s to send them."""
        self._disarm(conn)
        loop = asyncio.get_running_loop()
        self.waiting[conn] = loop.call_later(self.header_timeout_s, self._expire, conn)

    def busy(self, conn: Any) -> None:
        """A request is running on `conn`: no deadline here, and never shed."""
        self._disarm(conn)

    def closed(self, conn: Any) -> None:
        self._disarm(conn)
        self.open.discard(conn)

    def headers_overflow(self, conn: Any, data: bytes) -> bool:
        """Whether `data` takes a request's headers, still arriving, past the limit (then answered 431, closed)."""
        limit = self.max_header_bytes
        if limit is None or conn.conn.their_state is not h11.IDLE:  # IDLE: every byte is the next request's head
            return False
        pending = conn.conn.trailing_data[0]
        if len(pending) + len(data) <= limit:
            return False
        end = (pending + data).find(b"\r\n\r\n")
        if end != -1 and end + 4 <= limit:
            return False  # a whole head within the limit, then its body (or a pipelined request)
        body = json.dumps(headers_too_large(f"over {limit} bytes", limit).body()).encode()
        conn.transport.write(_HEADERS_TOO_LARGE % (len(body), body))
        self._close(conn, "too_large")
        return True

    # --- closing -------------------------------------------------------------------------------
    def _disarm(self, conn: Any) -> None:
        timer = self.waiting.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, conn: Any) -> None:
        if conn in self.waiting and not _in_request(conn):
            self._close(conn, "timed_out")

    def _close(self, conn: Any, why: str) -> None:
        self.closed(conn)  # now, not when the transport calls back: the cap counts it gone at once
        conn.transport.close()
        self._count(why)

    def _refuse(self, conn: Any) -> None:
        message = f"the server has {self.max_connections} connections open, each running a request; retry shortly"
        body = json.dumps(error_body(503, message, code="too_many_connections")).encode()
        conn.transport.write(_FULL % (len(body), body))
        self._close(conn, "refused")

    def _count(self, why: str) -> None:
        self.counts[why] += 1
        self.totals[why] += 1
        now = self.clock()
        if now - self._reported_at >= self.report_every_s:
            c = self.counts
            logger.warning(
                "connections closed since the last report: %d waiting for headers over %g s, %d idle or half-sent "
                "to make room, %d refused with every connection busy, %d with headers over %s bytes (limit %d "
                "open; %d open now; reported at most every %g s)",
                c["timed_out"], self.header_timeout_s, c["shed"], c["refused"], c["too_large"], self.max_header_bytes,
                self.max_connections, len(self.open), self.report_every_s,
            )  # fmt: skip
            self.counts = dict.fromkeys(self.counts, 0)
            self._reported_at = now


def _in_request(conn: Any) -> bool:
    cycle = conn.cycle
    return cycle is not None and not cycle.response_complete
