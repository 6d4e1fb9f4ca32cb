"""The OpenAPI document says what the server answers: error bodies per status, streams as text/event-stream.

FastAPI documents a route's 200 and a 422 it never sends here (validation errors are 400s, see
tandem.edge.errors). `install_openapi(app, operations)` rewrites the generated document once:
each listed operation gets its 200 body (a pydantic model, or another media type such as
text/plain for /metrics), `text/event-stream` beside JSON when it can stream, and every error
status it can answer with the one error body (`ErrorBody`); the unused 422 goes. Schema fuzzing
(tests/serve/test_schema_fuzz.py) holds every response to this document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict

__all__ = ["ErrorBody", "ErrorDetail", "Operation", "install_openapi", "EVENT_STREAM"]

EVENT_STREAM = "text/event-stream"
# Each server-sent event (OpenAPI 3.2's reading of a text/event-stream schema, and schemathesis's).
SSE_EVENT = {
    "type": "object",
    "description": "One event: `data` is a JSON chunk (the 200 JSON body's shape, with `delta`s for chat), "
    "an error body ({error: ...}) if the stream fails mid-way, or `[DONE]`, always last.",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    "required": ["data"],
}
_REASONS = {
    400: "The request is invalid (the message names the field)",
    401: "Missing or wrong API key",
    404: "No such model or endpoint",
    408: "The request body did not arrive in time",
    409: "Conflicts with what is under way",
    413: "The request body is too large",
    429: "At capacity; retry after the Retry-After header's seconds",
    500: "Internal error (the server log has the details)",
    502: "An upstream replica answered wrongly",
    503: "Not ready, shutting down, or no replica could serve it",
}


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str
    type: Literal["invalid_request_error", "rate_limit_error", "server_error"]
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error, as OpenAI's API writes it."""

    model_config = ConfigDict(extra="forbid")
    error: ErrorDetail


@dataclass(frozen=True)
class Operation:
    """What one operation answers besides errors."""

    ok: type[BaseModel] | None = None  # the 200 JSON body; None: any JSON
    ok_media: str = "application/json"  # e.g. text/plain (Prometheus)
    stream: bool = False  # also text/event-stream: `data: {chunk}` events ending in `data: [DONE]`
    errors: tuple[int, ...] = (400, 401, 404, 408, 413, 429, 500, 503)
    also: Mapping[int, type[BaseModel] | None] | None = None  # other statuses with their own body (503 of /ready)


def _schema_ref(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components.setdefault(model.__name__, schema)
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def install_openapi(app: FastAPI, operations: Mapping[tuple[str, str], Operation]) -> None:
    """Document `operations` ((path, method) -> Operation) in the app's OpenAPI document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        error_ref = _schema_ref(ErrorBody, components)
        for (path, method), op in operations.items():
            spec = doc["paths"].get(path, {}).get(method)
            if spec is None:
                continue
            responses = spec["responses"]
            responses.pop("422", None)
            ok_schema = _schema_ref(op.ok, components) if op.ok is not None else {}
            if not op.ok_media.endswith("json"):
                ok_schema = {"type": "string"}
            content: dict[str, Any] = {op.ok_media: {"schema": ok_schema}}
            if op.stream:
                content[EVENT_STREAM] = {"schema": SSE_EVENT}
            ok_status = next((status for status in responses if status.startswith("2")), "200")  # 202 stays 202
            responses[ok_status] = {"description": "Successful Response", "content": content}
            for status in op.errors:
                responses[str(status)] = {
                    "description": _REASONS.get(status, "Error"), "content": {"application/json": {"schema": error_ref}}
                }  # fmt: skip
            for status, model in (op.also or {}).items():
                schema = _schema_ref(model, components) if model is not None else {}
                responses[str(status)] = {
                    "description": _REASONS.get(status, "See the body"),
                    "content": {"application/json": {"schema": schema}},
                }
        for unused in ("HTTPValidationError", "ValidationError"):
            if unused not in str(doc["paths"]):
                components.pop(unused, None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
