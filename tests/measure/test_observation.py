"""The recorder turns a response (streamed or not, whole or broken) into an Observation with timings."""

import asyncio
import json

import httpx
import pytest
from completion_events import completion_chunk, sse, usage_chunk

from tandem.measure.observation import Observation, ResponseRecorder, observe


def test_stream_timings_from_events_and_token_count_from_usage():
    rec = ResponseRecorder(started_at=10.0, stream=True)
    rec.status(200)
    body = sse(completion_chunk("a"), completion_chunk("bc"), completion_chunk("d", finish="length"))
    events = body.split(b"\n\n")
    rec.feed(events[0] + b"\n\n", at=10.5)  # first output after 0.5 s
    rec.feed(events[1] + b"\n\n" + events[2][:7], at=10.7)  # an event split across reads
    rec.feed(events[2][7:] + b"\n\n", at=11.1)
    rec.feed(sse(usage_chunk(5), "[DONE]"), at=11.2)
    got = rec.finish(at=11.3)
    assert got.ok and got.text == "abcd" and got.finish_reason == "length"
    assert got.ttft_s == pytest.approx(0.5)
    assert got.completion_tokens == 5  # usage, not the 3 events (a speculative step sends several tokens)
    assert got.tpot_s == pytest.approx((11.1 - 10.5) / 4)
    assert got.e2e_s == pytest.approx(1.3)


def test_stream_token_count_falls_back_to_logprobs_then_events():
    rec = ResponseRecorder(0.0, stream=True)
    rec.status(200)
    rec.feed(sse(completion_chunk("ab", tokens=["a", "b"]), completion_chunk("c", tokens=["c"]), "[DONE]"), at=1.0)
    got = rec.finish(2.0)
    assert got.completion_tokens == 3 and got.tokens.tokens == ("a", "b", "c")
    assert got.tpot_s == 0.0  # all in one read: no time between tokens

    rec = ResponseRecorder(0.0, stream=True)
    rec.status(200)
    rec.feed(sse(completion_chunk("a"), "[DONE]"), at=1.0)
    got = rec.finish(2.0)
    assert got.completion_tokens == 1 and got.tpot_s is None  # one token has no time per output token


def test_chat_stream_deltas():
    rec = ResponseRecorder(0.0, stream=True)
    rec.status(200)
    chunk = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]}
    rec.feed(sse(chunk, "[DONE]"), at=0.2)
    assert rec.finish(0.3).text == "hi"


@pytest.mark.parametrize(
    "chunks, error",
    [
        ([completion_chunk("a")], "the stream ended before data: [DONE]"),
        ([completion_chunk("a"), {"error": {"message": "replica died"}}, "[DONE]"],
         "error event in the stream: replica died"),
        (["{not json", "[DONE]"], "the stream carried an event that is not JSON"),
    ],
)  # fmt: skip
def test_broken_streams_are_errors(chunks, error):
    rec = ResponseRecorder(0.0, stream=True)
    rec.status(200)
    rec.feed(b"".join(b"data: " + (c if isinstance(c, str) else json.dumps(c)).encode() + b"\n\n" for c in chunks), 1.0)
    got = rec.finish(2.0)
    assert not got.ok and got.error == error


def test_http_errors_carry_the_openai_message():
    rec = ResponseRecorder(0.0, stream=True)
    rec.status(400)
    rec.feed(json.dumps({"error": {"message": "max_tokens: too large", "type": "invalid_request_error"}}).encode(), 0.1)
    got = rec.finish(0.2)
    assert got.status == 400 and got.error == "HTTP 400: max_tokens: too large"


def test_non_streamed_body():
    rec = ResponseRecorder(0.0, stream=False)
    rec.status(200)
    body = {"choices": [{"index": 0, "text": "xyz", "finish_reason": "stop", "logprobs": None}],
            "usage": {"completion_tokens": 3}}  # fmt: skip
    rec.feed(json.dumps(body).encode(), 0.4)
    got = rec.finish(0.5)
    assert got.ok and got.text == "xyz" and got.completion_tokens == 3 and got.e2e_s == 0.5
    assert got.ttft_s is None and got.tpot_s is None  # a whole body says nothing about its first token


def test_observation_json_round_trip():
    rec = ResponseRecorder(0.0, stream=True)
    rec.status(200)
    rec.feed(sse(completion_chunk("ab", tokens=["a", "b"]), "[DONE]"), at=1.0)
    got = rec.finish(2.0)
    assert Observation.from_dict(json.loads(json.dumps(got.to_dict()))) == got


def test_observe_over_a_transport_and_its_failures():
    ticks = iter(range(100))

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/down":
            raise httpx.ConnectError("connection refused")
        assert json.loads(request.content)["prompt"] == "p"
        return httpx.Response(200, content=sse(completion_chunk("a"), completion_chunk("b"), usage_chunk(2), "[DONE]"))

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            ok = await observe(
                client, "http://r/v1/completions", b'{"prompt": "p"}', clock=lambda: next(ticks), stream=True
            )
            down = await observe(client, "http://r/down", b"{}", clock=lambda: next(ticks), stream=True)
        return ok, down

    ok, down = asyncio.run(main())
    assert ok.ok and ok.text == "ab" and ok.completion_tokens == 2
    assert down.status == 0 and down.error.startswith("ConnectError")
