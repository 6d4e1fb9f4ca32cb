"""The body middleware: too large (declared or counted), too slow, or not JSON -> an OpenAI-style 4xx
before the app runs; a good JSON body reaches FastAPI parsed once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import BaseModel

from tandem.edge.bodies import ParsedBodyRoute, RequestBodyMiddleware, parsed_body
from tandem.edge.errors import install_error_handlers


async def echo(scope, receive, send) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    parsed = parsed_body(scope)
    out = json.dumps({"bytes": len(body), "parsed": None if parsed is parsed_body({}) else parsed}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": out})


async def call(messages: list[dict[str, Any]], headers: list[tuple[bytes, bytes]], *, limit=100, timeout=5.0):
    """Run the middleware over `messages` (then a receive that never returns): (status, headers, body)."""
    app = RequestBodyMiddleware(echo, max_body_bytes=limit, body_timeout_s=timeout)
    pending, sent = list(messages), []

    async def receive():
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # a client that sends nothing more

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
    await app(scope, receive, send)
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def chunk(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.request", "body": data, "more_body": more}


def test_a_declared_length_over_the_limit_is_refused_before_reading():
    status, headers, body = asyncio.run(call([], [(b"content-length", b"1000000000")]))
    assert status == 413 and headers[b"connection"] == b"close"
    assert json.loads(body)["error"]["code"] == "request_too_large"


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit():
    messages = [chunk(b"x" * 60), chunk(b"x" * 60)] + [chunk(b"x" * 60)] * 1000  # the rest never read
    status, _, body = asyncio.run(call(messages, []))
    assert status == 413 and "at most 100 bytes" in json.loads(body)["error"]["message"]


def test_a_body_that_does_not_arrive_in_time_gets_408():
    status, headers, body = asyncio.run(call([chunk(b'{"a"')], [], timeout=0.2))
    assert status == 408 and headers[b"connection"] == b"close"
    assert json.loads(body)["error"] == {
        "message": "the request body did not arrive within 0.2 s", "type": "invalid_request_error", "param": None,
        "code": "request_timeout",
    }  # fmt: skip


def test_json_is_checked_and_handed_on_parsed():
    status, _, body = asyncio.run(call([chunk(b'{"prompt": "\\ud800"}', more=False)], []))
    assert status == 400 and json.loads(body)["error"]["param"] == "prompt"
    ok = asyncio.run(call([chunk(b'{"a": ', more=True), chunk(b"[1]}", more=False)], []))
    assert ok[0] == 200 and json.loads(ok[2]) == {"bytes": 10, "parsed": {"a": [1]}}
    text = asyncio.run(call([chunk(b"\xff not json", more=False)], [(b"content-type", b"text/plain")]))
    assert text[0] == 200 and json.loads(text[2])["parsed"] is None  # not JSON: left to the app


class Body(BaseModel):
    n: int


def test_fastapi_routes_validate_the_parsed_body_without_parsing_again(monkeypatch):
    from starlette.requests import Request

    app = FastAPI()
    install_error_handlers(app)
    app.router.route_class = ParsedBodyRoute

    @app.post("/n")
    async def n(body: Body) -> dict:
        return {"n": body.n}

    app.add_middleware(RequestBodyMiddleware, max_body_bytes=1000)

    async def never(self):  # Starlette's own parse must not run
        raise AssertionError("parsed twice")

    monkeypatch.setattr(Request, "json", never)

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
            return [
                await client.post("/n", content=b'{"n": 3}', headers={"content-type": "application/json"}),
                await client.post("/n", content=b""),
            ]

    good, empty = asyncio.run(main())
    assert good.json() == {"n": 3}
    assert empty.status_code == 400 and empty.json()["error"]["message"] == (
        "the request body is empty; send a JSON object"
    )
