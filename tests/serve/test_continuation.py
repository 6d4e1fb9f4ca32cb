"""A replica continues an answer from token ids (a stream the gateway resumes: tandem.serve.continuation):
greedy continuations are token for token the uninterrupted answer, whatever the break point, with the
text held back or not, and usage counts the whole answer; the token-id comments appear only when asked."""

from __future__ import annotations

import json

import httpx
import pytest

from tandem.edge.resume_wire import TOKEN_IDS_HEADER, parse_ids_comment

from .conftest import MODEL_NAME

TOKENS = 40
COMPLETION = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": TOKENS, "temperature": 0,
              "ignore_eos": True}  # fmt: skip
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": TOKENS,
        "temperature": 0, "ignore_eos": True}  # fmt: skip


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def streamed(client: httpx.Client, path: str, body: dict, ids: bool = True, points: list | None = None):
    """(text, token ids, usage, raw stream) of a streamed answer; `points` gets (ids, text) so far at each event."""
    headers = {TOKEN_IDS_HEADER: "1"} if ids else {}
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    raw = client.post(path, json=body, headers=headers).text
    text, tokens, usage = "", [], {}
    for line in raw.encode().split(b"\n"):
        parsed = parse_ids_comment(line)
        if parsed is not None:
            tokens += parsed[1]
        elif line.startswith(b"data: {"):
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event["choices"]:
                text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if points is not None:
                points.append((list(tokens), text))
    assert raw.endswith("data: [DONE]\n\n") and '"error"' not in raw, raw[-300:]
    return text, tokens, usage, raw


@pytest.mark.parametrize("path,body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_a_continuation_from_any_break_point_is_the_uninterrupted_answer(client, path, body):
    points: list = []
    whole, ids, usage, _ = streamed(client, path, body, points=points)
    assert len(ids) == TOKENS == usage["completion_tokens"]
    points = [p for p in points if 0 < len(p[0]) < TOKENS]
    for done, sent in (points[0], points[len(points) // 3], points[-1]):
        for text_sent in (len(sent), max(0, len(sent) - 3)):  # all of it sent, or the end held back
            cont = {**body, "tandem_continue": {"token_ids": done, "text_sent": text_sent}}
            rest, more, use, raw = streamed(client, path, cont)
            assert sent[:text_sent] + rest == whole, (len(done), text_sent)
            assert done + more == ids
            assert use["completion_tokens"] == TOKENS and use["prompt_tokens"] == usage["prompt_tokens"]
            assert '"role"' not in raw  # the client has the role chunk already
    whole_body = client.post(path, json={**body, "tandem_continue": {"token_ids": ids[:9]}}).json()
    choice = whole_body["choices"][0]
    assert (choice.get("text") or choice["message"]["content"]) == whole  # a non-streamed answer: all of it
    assert whole_body["usage"]["completion_tokens"] == TOKENS


def test_token_ids_are_sent_only_when_asked(client):
    _, ids, _, raw = streamed(client, "/v1/completions", COMPLETION, ids=False)
    assert ids == [] and "tandem-ids" not in raw


def test_what_cannot_be_continued_is_refused_by_name(client):
    cont = {"token_ids": [1, 2]}
    for body in (
        {**COMPLETION, "n": 2, "tandem_continue": cont},
        {**COMPLETION, "echo": True, "tandem_continue": cont},
        {**COMPLETION, "max_tokens": 2, "tandem_continue": cont},
        {**COMPLETION, "response_format": {"type": "json_object"}, "tandem_continue": cont},
        {**COMPLETION, "tandem_continue": {"token_ids": []}},
    ):
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == "tandem_continue" or "token_ids" in r.text
