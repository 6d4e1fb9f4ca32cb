"""Request bodies at the edge (an ASGI middleware): size, time, and JSON checked before any handler runs.

- Size: a declared Content-Length over the limit is refused at once (413), and a chunked body is
  counted as it arrives and refused as soon as it passes the limit; nothing over the limit is
  ever held in memory. The rest of such a body is never read, so the answer says
  `Connection: close`.
- Time: the whole body must arrive within `body_timeout_s` of the headers, else 408 (a client
  that trickles its body cannot hold a connection and a task for ever).
- JSON: a JSON body (Content-Type application/json, *+json, or none) is parsed once here by
  `parse_json_body` (large ones off the event loop): bad UTF-8, bad JSON, deep nesting and lone
  surrogates get a 400 naming the problem. The parsed value rides in the ASGI scope, where
  FastAPI routes built with `ParsedBodyRoute` and the gateway's proxy (`parsed_body`) take it
  instead of parsing again.

The body is buffered (small by definition) and replayed to the app, after which the app's
receive() is the server's again, so a client that leaves is still noticed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandem.edge.errors import APIError, error_response
from tandem.edge.json_body import parse_json_body_async

__all__ = ["NO_BODY", "ParsedBodyRoute", "RequestBodyMiddleware", "parsed_body"]

_SCOPE_KEY = "tandem.json_body"
NO_BODY: Any = object()  # parsed_body() of a request whose body was not JSON (or was empty)
_CLOSE = {"Connection": "close"}


def _is_json(content_type: bytes | None) -> bool:
    if not content_type:
        return True  # FastAPI reads a body without a Content-Type as JSON too
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def parsed_body(scope: Scope) -> Any:
    """The request's JSON body as parsed at the edge, or NO_BODY."""
    return scope.get(_SCOPE_KEY, NO_BODY)


class RequestBodyMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 30.0) -> None:
        self.app = app
        self.limit = max_body_bytes
        self.timeout_s = body_timeout_s

    def _too_large(self, size: str) -> APIError:
        return APIError(
            413, f"the request body is {size}; this server accepts at most {self.limit} bytes",
            code="request_too_large", headers=_CLOSE,
        )  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await error_response(self._too_large(f"{int(declared)} bytes"))(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            error = APIError(
                408, f"the request body did not arrive within {self.timeout_s:g} s", code="request_timeout",
                headers=_CLOSE,
            )  # fmt: skip
            await error_response(error)(scope, receive, send)
            return
        except APIError as error:
            await error_response(error)(scope, receive, send)
            return
        if body is None:
            return  # the client left before sending its body; nobody to answer
        if body and _is_json(headers.get(b"content-type")):
            try:
                scope[_SCOPE_KEY] = await parse_json_body_async(body)
            except APIError as error:
                await error_response(error)(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise self._too_large(f"over {self.limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


class _ParsedBodyRequest(Request):
    async def json(self) -> Any:
        value = parsed_body(self.scope)
        return await super().json() if value is NO_BODY else value


class ParsedBodyRoute(APIRoute):
    """A FastAPI route that validates the body the edge already parsed, rather than parsing it again."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(_ParsedBodyRequest(request.scope, request.receive))

        return handle
