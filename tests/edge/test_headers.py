"""The request line and headers are bounded (431 with an OpenAI-style body): a block that arrived whole
is measured from the ASGI scope; one still arriving is cut by the connection guard once past the limit."""

from __future__ import annotations

import asyncio
import json

import h11

from tandem.edge.connections import ConnectionGuard
from tandem.edge.headers import HeaderLimitMiddleware, header_block_size


def scope_with(headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "method": "GET", "path": "/v1/models", "raw_path": b"/v1/models", "headers": headers}


def run_middleware(headers: list[tuple[bytes, bytes]]) -> tuple[list[str], list[dict]]:
    reached: list[str] = []
    sent: list[dict] = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(HeaderLimitMiddleware(app, max_header_bytes=16384)(scope_with(headers), receive, send))
    return reached, sent


def test_the_size_is_the_request_line_and_headers_as_framed():
    head = b"GET /v1/models HTTP/1.1\r\nhost: a\r\nx-request-id: abc\r\n\r\n"
    assert header_block_size(scope_with([(b"host", b"a"), (b"x-request-id", b"abc")])) == len(head)


def test_600_headers_of_58_kb_and_one_60_kb_header_get_431_naming_the_limit():
    many = [(b"x-h%03d" % i, b"v" * 90) for i in range(600)]
    reached, sent = run_middleware(many)
    assert reached == [] and sent[0]["status"] == 431
    body = json.loads(sent[1]["body"])["error"]
    assert body["code"] == "request_header_fields_too_large" and "16384" in body["message"]
    assert (b"connection", b"close") in sent[0]["headers"]
    reached, sent = run_middleware([(b"x-request-id", b"r" * 60_000)])
    assert reached == [] and sent[0]["status"] == 431 and b"x-request-id" in sent[1]["body"]
    reached, _ = run_middleware([(b"x-request-id", b"r" * 100)])
    assert reached == ["/v1/models"]


class Transport:
    def __init__(self) -> None:
        self.written, self.closed = b"", False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Conn:
    def __init__(self) -> None:
        self.conn = h11.Connection(h11.SERVER)
        self.transport = Transport()
        self.cycle = None


def test_headers_still_arriving_past_the_limit_get_431_and_the_connection_closes():
    async def main() -> None:
        guard = ConnectionGuard(max_connections=10, header_timeout_s=60, max_header_bytes=16384)
        conn = Conn()
        guard.opened(conn)
        head = b"GET /v1/models HTTP/1.1\r\nhost: a\r\n" + b"x-pad: " + b"p" * 9000 + b"\r\n"
        assert not guard.headers_overflow(conn, head)
        conn.conn.receive_data(head)  # what uvicorn's protocol does with data that passed
        assert guard.headers_overflow(conn, b"x-more: " + b"m" * 9000 + b"\r\n")
        assert conn.transport.written.startswith(b"HTTP/1.1 431 ") and conn.transport.closed
        assert b"request_header_fields_too_large" in conn.transport.written and guard.totals["too_large"] == 1
        # A whole head within the limit followed by a large body is no header overflow.
        other = Conn()
        guard.opened(other)
        post = b"POST /v1/completions HTTP/1.1\r\nhost: a\r\ncontent-length: 40000\r\n\r\n" + b"x" * 40000
        assert not guard.headers_overflow(other, post)

    asyncio.run(main())
