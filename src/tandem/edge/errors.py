"""OpenAI-style errors: every failure leaves as {"error": {"message", "type", "param", "code"}}.

The one builder of that body (`error_body`), used by the server, the gateway and the SSE error
events both send. `type` is spelled one way per class of status: "invalid_request_error" for a
4xx, "rate_limit_error" for 429, "server_error" for a 5xx (OpenAI's own spellings).

Handlers turn FastAPI's validation errors (malformed JSON, wrong types, out-of-range values)
into 400s naming the field, Starlette's 404/405 into the same shape, and anything unexpected into
a 500 whose body carries no traceback (the traceback goes to the log, once). That last one is a
middleware, not an exception handler: Starlette re-raises after its handler for `Exception`
answered, and uvicorn then drops the keep-alive connection without `Connection: close`, so the
client's next request on it fails too. Bodies are written so that no text can fail to encode
(a lone surrogate comes out as its JSON escape).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "APIError",
    "ErrorJSONResponse",
    "UnhandledErrorMiddleware",
    "error_body",
    "error_response",
    "error_type",
    "install_error_handlers",
    "validation_message",
]

logger = logging.getLogger("tandem.http")


def error_type(status: int) -> str:
    """The body's `type` for a status: one spelling per class of status."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


class APIError(Exception):
    """Raise anywhere in a handler to answer with this status and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


class ErrorJSONResponse(JSONResponse):
    """JSON that always encodes: text that is not valid Unicode (a lone surrogate) is written as its escape."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")


def error_response(error: APIError) -> JSONResponse:
    return ErrorJSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _internal_error() -> APIError:
    return APIError(500, "internal server error; the server log has the details", code="internal_error")


class UnhandledErrorMiddleware:
    """Anything a handler did not expect: logged once, answered with a 500 body, connection kept.

    If the response had already started (a stream), it cannot become a 500: the exception is
    logged and the response left unfinished, which makes the server close that one connection.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            logger.exception("unhandled error serving %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await error_response(_internal_error())(scope, receive, send)


def _field_path(loc: tuple[Any, ...]) -> str | None:
    # FastAPI prefixes body fields with "body"; pydantic adds the union member tried ("str", "list[int]").
    parts = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS))]
    path = ""
    for part in parts:
        path += f"[{part}]" if part.isdigit() else (f".{part}" if path else part)
    return path or None


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None, str]:
    """(message, param, code) for the first problem in a pydantic/FastAPI error list."""
    if not errors:
        return "the request body is invalid", None, "invalid_request"
    err = errors[0]
    kind = err.get("type", "")
    if kind == "json_invalid":
        detail = (err.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON{f' ({detail})' if detail else ''}", None, "invalid_json"
    param = _field_path(tuple(err.get("loc", ())))
    msg = str(err.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if kind == "missing":
        if param is None:  # no body at all
            return "the request body is empty; send a JSON object", None, "missing_body"
        return f"{param}: this field is required", param, "missing_required_parameter"
    if param is None:  # the body itself, not a field, is wrong
        if kind == "value_error":  # a check across fields ("give exactly one of ...")
            return msg, None, "invalid_request"
        return "the request body must be a JSON object", None, "invalid_request"
    if kind == "extra_forbidden":
        return f"{param}: unknown field", param, "unknown_parameter"
    return f"{param}: {msg}", param, "invalid_value"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = validation_message(list(exc.errors()))
        return error_response(APIError(400, message, param=param, code=code))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        if status == 404:
            message, code = "no such endpoint (see GET /v1/models, POST /v1/completions)", "not_found"
        elif status == 405:
            message, code = "this endpoint does not accept that HTTP method", "method_not_allowed"
        else:
            # FastAPI answers "There was an error parsing the body" for bodies it cannot decode.
            message, code = str(exc.detail), "invalid_request"
        return error_response(APIError(status, message, code=code, headers=dict(exc.headers or {})))

    # Innermost of the app's middlewares: it sees what the routes raise, before Starlette's own.
    app.add_middleware(UnhandledErrorMiddleware)
