"""Request paths at the edge: only a canonical path reaches routing and the key check (an ASGI middleware).

uvicorn hands the app the request target percent-decoded and otherwise as sent, and nothing between
it and the routes resolves dot segments. A proxy that then glues such a path to a replica's URL lets
the HTTP client resolve them (httpx does, RFC 3986): `/v1/models/../../metrics` became a replica's
`/metrics`, sent with the fleet's secret. So a path that is not canonical is refused before
anything reads it, with a 404 naming why:

- not origin-form (`GET http://host/metrics`, `*`): only `/...` targets are served;
- a `.` or `..` segment, raw or percent-encoded (`%2e%2e/`, `.%2E/`);
- an empty segment (`//`) anywhere but a trailing slash;
- an encoded `/`, `\\` or `%` (`..%2f`, `%5c`, `%252e`: a second decoding would change the path),
  a raw `\\`, or a control character.

What remains means one thing to every parser on the way, so the template the router matches, the
prefix the key check protects and the path forwarded to a replica are the same path.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from tandem.edge.errors import APIError, error_response

__all__ = ["CanonicalPathMiddleware", "path_problem"]

_ENCODED_SEPARATOR = re.compile(rb"%(2f|5c|25)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SHOWN = 120  # characters of a refused path quoted back


def path_problem(raw_path: bytes, path: str) -> str | None:
    """Why this request target is not a canonical path (None: it is). `raw_path` as sent, `path` decoded."""
    if not raw_path.startswith(b"/"):
        return "only origin-form targets (/path) are served"
    if _ENCODED_SEPARATOR.search(raw_path):
        return "it has an encoded '/', '\\' or '%'"
    if "\\" in path or _CONTROL.search(path):
        return "it has a '\\' or a control character"
    segments = path.split("/")[1:]
    for i, segment in enumerate(segments):
        if segment in (".", ".."):
            return "it has a '.' or '..' segment"
        if segment == "" and i != len(segments) - 1:
            return "it has an empty segment ('//')"
    return None


class CanonicalPathMiddleware:
    """Answers 404 to a request whose path is not canonical (see the module's doc), before any route or check."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
            problem = path_problem(raw, scope["path"])
            if problem is not None:
                shown = raw.decode("latin-1")
                shown = shown if len(shown) <= _SHOWN else shown[:_SHOWN] + "..."
                error = APIError(
                    404, f"no such endpoint: the path {shown!r} is not canonical ({problem})", code="not_found"
                )
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
