"""Request-body size limit (an ASGI middleware): bodies over the limit get 413 before any parsing.

A declared Content-Length over the limit is refused at once; a chunked body is counted as it
arrives. The body is buffered here (it is small by definition) and replayed to the app, after
which the app's receive() is the server's again, so disconnects are still seen.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tandem.edge.errors import APIError, error_response

__all__ = ["BodySizeLimitMiddleware"]


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.limit = max_body_bytes

    def _too_large(self, size: str) -> APIError:
        return APIError(
            413, f"the request body is {size}; this server accepts at most {self.limit} bytes", code="request_too_large"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await error_response(self._too_large(f"{int(declared)} bytes"))(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body; nothing to answer
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await error_response(self._too_large(f"over {self.limit} bytes"))(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
