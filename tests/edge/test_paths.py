"""Only canonical paths reach routing and the key check: dot segments (raw or encoded), empty
segments, encoded separators and absolute-form targets get a 404 naming why, before any route runs."""

from __future__ import annotations

import asyncio

import pytest

from tandem.edge.paths import CanonicalPathMiddleware, path_problem

CANONICAL = ["/", "/v1/completions", "/v1/models/org/name", "/v1/models/qwen2.5-0.5b", "/v1/models/", "/a.b/c..d"]
NOT_CANONICAL = [
    ("/v1/models/../../metrics", "'..'"),
    ("/v1/models/./x", "'.'"),
    ("/v1/models/%2e%2e/%2e%2e/load", "'..'"),
    ("/v1/models/.%2E/.%2e/load", "'..'"),
    ("/v1/models/..%2f..%2fmetrics", "encoded"),
    ("/v1/models/..%2F..%2Fmetrics", "encoded"),
    ("/v1/models/%252e%252e/metrics", "encoded"),
    ("/v1/models/..%5c..%5cmetrics", "encoded"),
    ("/v1/models/..\\..\\metrics", "'\\\\'"),
    ("//metrics", "empty segment"),
    ("/v1//completions", "empty segment"),
    ("http://127.0.0.1:9000/metrics", "origin-form"),
    ("*", "origin-form"),
    ("/v1/models/a%00b", "control"),
]


def decoded(raw: str) -> str:
    from urllib.parse import unquote

    return unquote(raw)  # as uvicorn decodes the target


@pytest.mark.parametrize("raw", CANONICAL)
def test_canonical_paths_pass(raw):
    assert path_problem(raw.encode(), decoded(raw)) is None


@pytest.mark.parametrize(("raw", "why"), NOT_CANONICAL)
def test_traversal_forms_are_named(raw, why):
    problem = path_problem(raw.encode(), decoded(raw))
    assert problem is not None and why.strip("'").replace("\\\\", "\\") in problem, problem


def test_the_middleware_answers_404_before_the_app_runs():
    reached: list[str] = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def main() -> None:
        guard = CanonicalPathMiddleware(app)
        raw = b"/v1/models/%2e%2e/%2e%2e/metrics"
        scope = {"type": "http", "method": "GET", "path": decoded(raw.decode()), "raw_path": raw, "headers": []}
        await guard(scope, receive, send)
        assert reached == [] and sent[0]["status"] == 404
        assert b"not canonical" in sent[1]["body"] and b'"code":"not_found"' in sent[1]["body"]
        scope = {"type": "http", "method": "GET", "path": "/v1/models", "raw_path": b"/v1/models", "headers": []}
        await guard(scope, receive, send)
        assert reached == ["/v1/models"]

    asyncio.run(main())
