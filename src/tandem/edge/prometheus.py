"""The /metrics page of both apps, and HTTP responses counted by status at the outermost ASGI layer.

- `metrics_response(registry)`: the text exposition. Importing this module turns off
  prometheus_client's `_created` series process-wide (the one place it is done): every counter and
  histogram would otherwise carry a `<name>_created` twin that doubles the page and that no vLLM
  dashboard reads.
- `HttpResponseCounter`: ASGI middleware that counts each response by route template, method and
  status code. Added last, it wraps every other middleware, so the 401, 408, 413 and 429 answers
  given before a route runs are counted as well as the routes' own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, disable_created_metrics, generate_latest
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HttpResponseCounter", "metrics_response"]

disable_created_metrics()


def metrics_response(registry: CollectorRegistry) -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class HttpResponseCounter:
    """Calls `count(handler, method, status)` once per HTTP response.

    `handler` is the route's path template (/v1/completions), or "none" for a path no route serves,
    so a scan of random paths cannot grow the label set without bound. Requests to `uncounted` paths
    (probes, the scrape itself) are not counted. A request whose handling raised before any response
    started is counted as 500, the answer the server then sends.
    """

    def __init__(self, app: ASGIApp, count: Callable[[str, str, int], None], uncounted: Collection[str] = ()) -> None:
        self.app, self.count, self.uncounted = app, count, frozenset(uncounted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.uncounted:
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start" and status is None:
                status = message["status"]
                self.count(_handler(scope), scope["method"], status)
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except BaseException:
            if status is None:
                self.count(_handler(scope), scope["method"], 500)
            raise


def _handler(scope: Scope) -> str:
    """The template of the route that serves (or would serve) this path; "none" when no route does."""
    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        match, _ = route.matches(scope)
        if match is not Match.NONE:  # FULL, or PARTIAL: the path matches, the method does not (405)
            return getattr(route, "path", scope["path"])
    return "none"
