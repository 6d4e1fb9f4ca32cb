"""ConnectionGuard: connections waiting for headers close after the deadline; over the cap the oldest
waiting one makes room; a connection with a request running is never cut."""

from __future__ import annotations

import asyncio

from tandem.edge.connections import ConnectionGuard


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False
        self.written = b""

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed


class Cycle:
    response_complete = False


class Conn:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.cycle: Cycle | None = None

    def start_request(self, guard: ConnectionGuard) -> None:
        self.cycle = Cycle()
        guard.busy(self)

    def finish_request(self, guard: ConnectionGuard) -> None:
        self.cycle.response_complete = True
        guard.idle(self)


def test_over_the_cap_the_oldest_waiting_connection_closes_and_running_ones_never_do():
    async def main() -> None:
        guard = ConnectionGuard(max_connections=3, header_timeout_s=60)
        running, idle, fresh = Conn(), Conn(), Conn()
        for conn in (running, idle, fresh):
            guard.opened(conn)
        running.start_request(guard)
        newest = Conn()
        guard.opened(newest)  # over the cap: `idle` (oldest waiting) makes room
        assert idle.transport.closed and not running.transport.closed and not fresh.transport.closed
        assert guard.totals["shed"] == 1 and len(guard.open) == 3
        fresh.start_request(guard)
        newest.start_request(guard)
        refused = Conn()
        guard.opened(refused)  # every other connection runs a request: this one is answered 503
        assert refused.transport.closed and refused.transport.written.startswith(b"HTTP/1.1 503")
        assert b'"code": "too_many_connections"' in refused.transport.written
        assert not any(c.transport.closed for c in (running, fresh, newest))

    asyncio.run(main())


def test_a_connection_waiting_for_headers_closes_after_the_deadline_also_after_a_response():
    async def main() -> None:
        guard = ConnectionGuard(max_connections=10, header_timeout_s=0.05)
        silent, served = Conn(), Conn()
        guard.opened(silent)
        guard.opened(served)
        served.start_request(guard)
        await asyncio.sleep(0.2)
        assert silent.transport.closed and not served.transport.closed  # a running request has no deadline
        served.finish_request(guard)  # keep-alive: the next request's headers are due within the deadline
        await asyncio.sleep(0.2)
        assert served.transport.closed and guard.totals["timed_out"] == 2

    asyncio.run(main())
