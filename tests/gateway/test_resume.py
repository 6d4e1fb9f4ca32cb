"""The stream ledger and the continuation body (tandem.gateway.resume), and a stream resumed through
the gateway's proxy on a MockTransport: one stream to the client, nothing repeated or missing."""

from __future__ import annotations

import asyncio
import json

import httpx

from tandem.edge.resume_wire import CONTINUE_FIELD, TOKEN_IDS_HEADER, ids_comment
from tandem.gateway.resume import StreamLedger, continuation
from tandem.schedule.fallback import FailureKind

from .harness import metric
from .test_proxy import HPA, _gateway, _metrics, call, one


def event(text: str, finish: str | None = None, **more) -> bytes:
    return b"data: " + json.dumps({"id": "cmpl-1", "created": 1, "choices": [{"index": 0, "text": text,
                                   "finish_reason": finish}], **more}).encode() + b"\n\n"  # fmt: skip


def test_the_ledger_relays_whole_events_strips_ids_and_holds_an_error_back():
    ledger = StreamLedger(chat=False)
    raw = ids_comment(0, [5, 6]) + event("ab") + ids_comment(0, [7]) + event("c")
    out = ledger.feed(raw[:-3]) + ledger.feed(raw[-3:])
    assert out == event("ab") + event("c") and ledger.ids == [5, 6, 7] and ledger.text == "abc"
    assert ledger.feed(b'data: {"id": "cmpl-1", "ch') == b""  # half an event is never relayed
    assert ledger.feed(b'oices": []}\n\n') == b'data: {"id": "cmpl-1", "choices": []}\n\n'
    assert ledger.feed(b'data: {"error": {"message": "boom", "code": null}}\n\ndata: [DONE]\n\n') == b""
    assert ledger.broken and ledger.error["error"]["message"] == "boom" and not ledger.done


def test_a_continuation_s_events_join_the_stream_with_its_id_and_one_role():
    ledger = StreamLedger(chat=True)
    first = (
        b'data: {"id": "a", "created": 1, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
    )
    ledger.feed(first + b'data: {"id": "a", "created": 1, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n')
    ledger.restart(text_continuation=True)
    again = first.replace(b'"a"', b'"b"').replace(b"1,", b"9,")
    usage = {"prompt_tokens": 10, "completion_tokens": 3}
    out = ledger.feed(again + b'data: {"id": "b", "created": 9, "choices": [], "usage": ' + json.dumps(usage).encode()
                      + b"}\n\ndata: [DONE]\n\n")  # fmt: skip
    events = [json.loads(line[6:]) for line in out.split(b"\n\n") if line.startswith(b"data: {")]
    assert len(events) == 1 and events[0]["id"] == "a" and events[0]["created"] == 1  # no second role chunk
    assert events[0]["usage"] == {"prompt_tokens": 9, "completion_tokens": 4}  # the 1 token relayed counted back
    assert out.endswith(b"data: [DONE]\n\n") and ledger.done


def test_the_continuation_body_for_a_tandem_replica_an_external_engine_or_none():
    payload = {"model": "m", "prompt": "p", "max_tokens": 10, "stream": True}
    ledger = StreamLedger(chat=False, ids=[3, 4], text="xy", events=2)
    body, _ = continuation(payload, ledger, tandem_target=True)
    assert body == {**payload, CONTINUE_FIELD: {"token_ids": [3, 4], "text_sent": 2}}
    body, _ = continuation(payload, ledger, tandem_target=False, engine_adapter="none")
    assert body == {**payload, "prompt": "pxy", "max_tokens": 8}
    chat = {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True}
    chat_ledger = StreamLedger(chat=True, text="an", events=1)
    body, _ = continuation(chat, chat_ledger, tandem_target=False, engine_adapter="vllm")
    assert body["messages"][-1] == {"role": "assistant", "content": "an"} and body["continue_final_message"]
    assert body["add_generation_prompt"] is False
    for why, args in [
        ("a chat on an engine", (chat, chat_ledger, False, "llamacpp")),
        ("n > 1", ({**payload, "n": 2}, ledger, True)),
        ("structured output", ({**payload, "response_format": {"type": "json_object"}}, ledger, True)),
        ("token ids", ({**payload, "prompt": [1, 2]}, StreamLedger(chat=False), False, "none")),
    ]:
        body, reason = continuation(*args)
        assert body is None and why in reason, (why, reason)


def _stream(*parts: bytes, cut: bool) -> httpx.AsyncByteStream:
    class Parts(httpx.AsyncByteStream):
        async def __aiter__(self):
            for part in parts:
                yield part
            if cut:
                raise httpx.ReadError("connection reset")

    return Parts()


def test_a_stream_cut_mid_way_resumes_on_another_replica_from_its_token_ids():
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append({"host": request.url.host, "body": body, "ids": request.headers.get(TOKEN_IDS_HEADER)})
        if request.url.host == "fast-1":
            parts = (ids_comment(0, [1]) + event("Once"), ids_comment(0, [2]) + event(" upon")[:-9])
            return httpx.Response(200, stream=_stream(*parts, cut=True), headers={"content-type": "text/event-stream"})
        parts = (ids_comment(0, [2]) + event(" upon", id="x"), event(" a time", "length") + b"data: [DONE]\n\n")
        return httpx.Response(200, stream=_stream(*parts, cut=False), headers={"content-type": "text/event-stream"})

    gw, _ = _gateway({"variants": [one(lo=2)], "policy": HPA}, handler)
    response = call(gw, {"model": "tiny", "prompt": "p", "max_tokens": 4, "stream": True})
    texts = [json.loads(line[6:])["choices"][0]["text"] for line in response.text.split("\n\n") if "{" in line]
    assert texts == ["Once", " upon", " a time"] and response.text.endswith("data: [DONE]\n\n")
    assert "tandem-ids" not in response.text and '"id":"x"' not in response.text
    assert [s["host"] for s in sent] == ["fast-1", "fast-2"] and all(s["ids"] == "1" for s in sent)
    assert sent[1]["body"][CONTINUE_FIELD] == {"token_ids": [1, 2], "text_sent": 4}
    text = asyncio.run(_metrics(gw))
    assert metric(text, "tandem:gateway_resumes_total", variant="fast", reason=FailureKind.UNREACHABLE.value) == 1
    assert metric(text, "tandem:gateway_stream_errors_total", variant="fast") == 0
    assert not gw.fleet.inflight.running


def test_a_stream_a_draining_replica_cuts_at_its_shutdown_deadline_resumes_elsewhere():
    """A replica's shutdown deadline ends its streams with a 503 `shutting_down` error event (tandem.serve):
    the gateway holds it back and resumes the stream on another replica of the variant."""
    farewell = b'data: {"error": {"message": "the server shut down", "type": "server_error", "code": "shutting_down"}}'

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "fast-1":
            parts = (ids_comment(0, [1]) + event("Once"), farewell + b"\n\ndata: [DONE]\n\n")
        else:
            assert json.loads(request.content)[CONTINUE_FIELD] == {"token_ids": [1], "text_sent": 4}
            parts = (event(" more", "length"), b"data: [DONE]\n\n")
        return httpx.Response(200, stream=_stream(*parts, cut=False), headers={"content-type": "text/event-stream"})

    gw, _ = _gateway({"variants": [one(lo=2)], "policy": HPA}, handler)
    response = call(gw, {"model": "tiny", "prompt": "p", "max_tokens": 4, "stream": True})
    assert '"error"' not in response.text and response.text.count("data: [DONE]") == 1
    texts = [json.loads(line[6:])["choices"][0]["text"] for line in response.text.split("\n\n") if "{" in line]
    assert texts == ["Once", " more"]
    text = asyncio.run(_metrics(gw))
    assert metric(text, "tandem:gateway_resumes_total", variant="fast", reason="unavailable") == 1
    assert not gw.fleet.inflight.running
