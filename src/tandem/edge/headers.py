"""The request line and headers, bounded as documented (`max_header_bytes`, 16 KiB by default): 431 past it.

h11's `max_incomplete_event_size` only bounds a header block that is still arriving: one that comes
whole in a single read (58 KB of 600 headers, a 60 KB `x-request-id`) passed it and was forwarded.
So the limit is kept twice, with one answer (`headers_too_large`, 431, `Connection: close`):

- here, an ASGI middleware, for a block that arrived whole: its size is counted from the scope
  before any route, key check or body read;
- in tandem.edge.connections, for a block still arriving that is already over the limit.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from tandem.edge.errors import APIError, error_response

__all__ = ["HeaderLimitMiddleware", "header_block_size", "headers_too_large"]

_REQUEST_LINE_EXTRA = len(b"  HTTP/1.1\r\n")


def header_block_size(scope: Scope) -> int:
    """Bytes of the request line and headers as they came on the wire (HTTP/1.1 framing)."""
    target = len(scope.get("raw_path") or scope["path"].encode())
    query = scope.get("query_string") or b""
    size = len(scope["method"]) + target + (len(query) + 1 if query else 0) + _REQUEST_LINE_EXTRA
    return size + sum(len(name) + len(value) + 4 for name, value in scope["headers"]) + 2


def headers_too_large(size: str, limit: int, largest: tuple[bytes, int] | None = None) -> APIError:
    """The one answer to a header block over the limit. `size`: how large it is, in words."""
    detail = f" (the largest header, {largest[0].decode('latin-1')[:64]!r}, is {largest[1]} bytes)" if largest else ""
    return APIError(
        431,
        f"the request line and headers are {size}{detail}; this server accepts at most {limit} bytes of them",
        code="request_header_fields_too_large",
        headers={"Connection": "close"},
    )


class HeaderLimitMiddleware:
    def __init__(self, app: ASGIApp, max_header_bytes: int) -> None:
        self.app = app
        self.limit = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = header_block_size(scope)
            if size > self.limit:
                sizes = [(name, len(name) + len(value)) for name, value in scope["headers"]]
                error = headers_too_large(f"{size} bytes", self.limit, max(sizes, key=lambda s: s[1], default=None))
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
