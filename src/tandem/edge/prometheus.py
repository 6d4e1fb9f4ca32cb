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
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["METHODS", "HttpResponseCounter", "method_label", "metrics_response"]

disable_created_metrics()

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


def metrics_response(registry: CollectorRegistry) -> Response:
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class HttpResponseCounter:
    """Calls `count(handler, method, status)` once per HTTP response.

    `handler` is the route's path template (/v1/completions), or "none" for a path no route serves,
    and `method` one of METHODS or "other", so a scan of random paths and methods (answered 401 or
    404 alike) cannot grow the label set: every label comes from a closed set. Requests to `uncounted` paths
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
                self.count(_handler(scope), method_label(scope["method"]), status)
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except BaseException:
            if status is None:
                self.count(_handler(scope), method_label(scope["method"]), 500)
            raise


def method_label(method: str) -> str:
    """The request's method if it is one of HTTP's usual ones, else "other" (any token is a valid method)."""
    return method if method in METHODS else "other"


def _template(route: BaseRoute, scope: Scope) -> str | None:
    match, _ = route.matches(scope)
    if match is Match.NONE:  # FULL, or PARTIAL: the path matches, the method does not (405)
        return None
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    # A router included in another (FastAPI's include_router): the template is one of its routes'.
    for inner in getattr(getattr(route, "original_router", None), "routes", ()):
        template = _template(inner, scope)
        if template is not None:
            return template
    return "other"  # a route without a template: never the raw path


def _handler(scope: Scope) -> str:
    """The template of the route that serves (or would serve) this path; "none" when no route does."""
    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        template = _template(route, scope)
        if template is not None:
            return template
    return "none"
