"""Streams: SSE framing, merging choices, and a client that leaves: its requests are aborted at once
(pure async tests, and against a real server for streaming and non-streaming requests)."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from metrics_text import scrape, value

from tandem.serve.streaming import SSE_DONE, ClientDisconnected, merge, sse, until_disconnect

from .conftest import CONTEXT, MODEL_NAME

LABELS = {"model_name": MODEL_NAME, "recipe": "baseline"}


def test_sse_frames_compact_json():
    assert sse({"a": [1, "é"]}) == 'data: {"a":[1,"é"]}\n\n'.encode()
    assert SSE_DONE == b"data: [DONE]\n\n"


async def _numbers(tag: str, count: int, closed: set[str], fail_at: int | None = None):
    try:
        for i in range(count):
            if i == fail_at:
                raise RuntimeError(f"{tag} failed")
            yield f"{tag}{i}"
            await asyncio.sleep(0)
    finally:
        closed.add(tag)


def test_merge_tags_every_item_with_its_source():
    async def main():
        closed: set[str] = set()
        items = [x async for x in merge([_numbers("a", 3, closed), _numbers("b", 2, closed)])]
        return items, closed

    items, closed = asyncio.run(main())
    assert sorted(items) == [(0, "a0"), (0, "a1"), (0, "a2"), (1, "b0"), (1, "b1")]
    assert [x for p, x in items if p == 0] == ["a0", "a1", "a2"]  # each source keeps its order
    assert closed == {"a", "b"}


@pytest.mark.parametrize("sources", [1, 3])
def test_closing_the_merge_closes_every_source(sources):
    async def main():
        closed: set[str] = set()
        merged = merge([_numbers(str(i), 100, closed) for i in range(sources)])
        await anext(merged)
        await merged.aclose()
        return closed

    assert asyncio.run(main()) == {str(i) for i in range(sources)}


def test_an_error_in_one_source_is_raised_and_closes_the_others():
    async def main():
        closed: set[str] = set()
        with pytest.raises(RuntimeError, match="b failed"):
            async for _ in merge([_numbers("a", 10**6, closed), _numbers("b", 5, closed, fail_at=2)]):
                pass
        return closed

    assert asyncio.run(main()) == {"a", "b"}


def test_until_disconnect_returns_the_result_or_cancels_the_work():
    async def never_disconnects():
        await asyncio.Event().wait()

    async def disconnects():
        return {"type": "http.disconnect"}

    async def main():
        assert await until_disconnect(asyncio.sleep(0, result=7), never_disconnects) == 7
        cancelled = asyncio.Event()

        async def long_work():
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()

        with pytest.raises(ClientDisconnected):
            await until_disconnect(long_work(), disconnects)
        return cancelled.is_set()

    assert asyncio.run(main())


def _wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


LONG = {"model": MODEL_NAME, "prompt": "a", "max_tokens": CONTEXT - 8, "temperature": 0, "ignore_eos": True}


def _assert_aborted_early(server, before) -> None:
    """The request ended as an abort (not "length"), nothing runs, and it stopped well short of max_tokens."""

    def aborted() -> bool:
        now = scrape(server.url)
        done = value(now, "tandem:request_success_total", finished_reason="abort", **LABELS)
        return done > value(before, "tandem:request_success_total", finished_reason="abort", **LABELS) and (
            value(now, "tandem:num_requests_running", **LABELS) == 0
        )

    _wait_for(aborted)
    after = scrape(server.url)
    for reason in ("stop", "length"):
        name = "tandem:request_success_total"
        assert value(after, name, finished_reason=reason, **LABELS) == value(
            before, name, finished_reason=reason, **LABELS
        )
    generated = value(after, "tandem:generation_tokens_total", **LABELS) - value(
        before, "tandem:generation_tokens_total", **LABELS
    )
    assert generated < LONG["max_tokens"]


def test_a_client_leaving_mid_stream_frees_its_slot(server):
    before = scrape(server.url)
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}) as stream:
            lines = stream.iter_lines()
            assert json.loads(next(lines).removeprefix("data: "))["choices"]
    # The connection is closed here, long before CONTEXT - 8 tokens.
    _assert_aborted_early(server, before)


def test_a_client_leaving_a_non_streaming_request_frees_its_slot(server):
    before = scrape(server.url)
    body = json.dumps(LONG).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        )
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        _wait_for(lambda: value(scrape(server.url), "tandem:num_requests_running", **LABELS) == 1)
    _assert_aborted_early(server, before)


def test_a_stream_that_fails_mid_way_ends_with_an_error_event_and_done(tiny_llama_dir):
    """The engine raises after the first token: the client gets that token, an error event, then [DONE]."""
    import json
    import time

    from fastapi.testclient import TestClient

    from tandem.edge.settings import Settings
    from tandem.serve import create_app, load_served_model

    config = Settings(
        recipe="baseline", model=str(tiny_llama_dir), served_model_name="tiny", max_model_len=48, max_num_seqs=2,
        threads=1,
    )  # fmt: skip
    app = create_app(config, lambda: load_served_model(config, created=0))
    with TestClient(app) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        engine = app.state.tandem.served.async_engine
        real = engine.generate

        def breaks_after_one(*args, **kwargs):
            async def outputs():
                async for out in real(*args, **kwargs):
                    yield out
                    raise RuntimeError("the engine broke")

            return outputs()

        engine.generate = breaks_after_one
        for path, body in [
            ("/v1/completions", {"prompt": "def", "max_tokens": 8, "ignore_eos": True}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
        ]:
            r = client.post(path, json={"model": "tiny", "stream": True, **body})
            assert r.status_code == 200
            events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
            assert events[-1] == "[DONE]", r.text
            error = json.loads(events[-2])["error"]
            assert error["code"] == "internal_error" and error["type"] == "server_error"
            assert "choices" in json.loads(events[0])  # what came before the failure reached the client
