"""Bad requests get OpenAI-style 4xx bodies naming the problem (raw httpx against a real server):
404 unknown model/route, 400 malformed or out-of-range input and context overflows, 401 keys,
413 bodies over the limit, 429 with Retry-After when the queue is full."""

from __future__ import annotations

import httpx
import pytest

from .conftest import API_KEY, CONTEXT, MODEL_NAME

COMPLETION = {"model": MODEL_NAME, "prompt": "def add", "max_tokens": 4}
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def http():
    # Generous timeouts: the machine is shared, and a slow answer is not what these tests are about.
    with httpx.Client(timeout=60) as client:
        yield client


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None, code: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


BAD_COMPLETIONS = [
    ({**COMPLETION, "model": "gpt-4"}, 404, "model", "model_not_found"),
    ({"prompt": "x"}, 400, "model", "missing_required_parameter"),
    ({**COMPLETION, "max_tokens": "5"}, 400, "max_tokens", None),
    ({**COMPLETION, "max_tokens": 0}, 400, "max_tokens", None),
    ({**COMPLETION, "temperature": 2.5}, 400, "temperature", None),
    ({**COMPLETION, "temperature": True}, 400, "temperature", None),
    ({**COMPLETION, "top_p": 0}, 400, "top_p", None),
    ({**COMPLETION, "n": 0}, 400, "n", None),
    ({**COMPLETION, "n": 17}, 400, "n", None),
    ({**COMPLETION, "seed": -1}, 400, "seed", None),
    ({**COMPLETION, "logprobs": 21}, 400, "logprobs", None),
    ({**COMPLETION, "stream": "yes"}, 400, "stream", None),
    ({**COMPLETION, "stop": [1]}, 400, "stop", None),
    ({**COMPLETION, "stop": [""]}, 400, "stop", None),
    ({**COMPLETION, "prompt": []}, 400, "prompt", None),
    ({**COMPLETION, "prompt": [0, 99999]}, 400, "prompt", None),
    ({**COMPLETION, "prompt": ["a", 1]}, 400, "prompt", None),
    ({**COMPLETION, "prompt": "x " * CONTEXT}, 400, "prompt", "context_length_exceeded"),
    ({**COMPLETION, "max_tokens": CONTEXT}, 400, "max_tokens", "context_length_exceeded"),
    ({**COMPLETION, "frequency_penalty": 2.5}, 400, "frequency_penalty", None),
    ({**COMPLETION, "repetition_penalty": 0}, 400, "repetition_penalty", None),
    ({**COMPLETION, "min_p": 1.5}, 400, "min_p", None),
    ({**COMPLETION, "min_tokens": 9, "max_tokens": 4}, 400, "min_tokens", None),
    ({**COMPLETION, "logit_bias": {"5": 101}}, 400, "logit_bias[5]", None),
    ({**COMPLETION, "logit_bias": {"five": 1}}, 400, "logit_bias", None),
    ({**COMPLETION, "logit_bias": {"99999": 1}}, 400, "logit_bias", None),
    ({**COMPLETION, "bad_words": [" "]}, 400, "bad_words", None),
    # vLLM's parameters tandem lacks, and names neither API knows: refused by name, never ignored.
    ({**COMPLETION, "use_beam_search": True}, 400, "use_beam_search", "unsupported_parameter"),
    ({**COMPLETION, "guided_json": {"type": "strin"}}, 400, "guided_json", "invalid_value"),
    ({**COMPLETION, "guided_json": {"type": "array", "uniqueItems": True}}, 400, "guided_json", "unsupported_value"),
    ({**COMPLETION, "prompt_logprobs": 1}, 400, "prompt_logprobs", "unsupported_parameter"),
    ({**COMPLETION, "best_of": 3}, 400, "best_of", "unsupported_parameter"),
    ({**COMPLETION, "temprature": 0.5}, 400, "temprature", "unknown_parameter"),
    ({**COMPLETION, "stream": True, "stream_options": {"continuous_usage_stats": 1}}, 400, None, None),
    ({**COMPLETION, "max_tokens": -1}, 400, "max_tokens", None),
    ({**COMPLETION, "echo": True, "suffix": "x"}, 400, "suffix", "unsupported_parameter"),
    ({**COMPLETION, "stream_options": {"include_usage": True}}, 400, "stream_options", None),
]


@pytest.mark.parametrize(("body", "status", "param", "code"), BAD_COMPLETIONS)
def test_bad_completion_requests(http, server, body, status, param, code):
    assert_openai_error(http.post(server.url + "/v1/completions", json=body), status, param, code)


BAD_CHATS = [
    ({**CHAT, "messages": []}, 400, "messages", None),
    ({**CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", None),
    ({**CHAT, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, None, None),
    ({**CHAT, "max_completion_tokens": CONTEXT}, 400, "max_completion_tokens", "context_length_exceeded"),
    ({**CHAT, "messages": [{"role": "user", "content": "x " * CONTEXT}]}, 400, "messages", "context_length_exceeded"),
    ({**CHAT, "top_logprobs": 2}, 400, "top_logprobs", None),
    # tool_choice "auto" (the default with tools) needs --tool-call-parser, which this server lacks.
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool_choice", "unsupported_value"),
    (
        {
            **CHAT,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "tool_choice",
        "invalid_value",
    ),
    ({**CHAT, "tools": [{"type": "retrieval"}], "tool_choice": "required"}, 400, "tools[0]", "invalid_value"),
    ({**CHAT, "use_beam_search": True}, 400, "use_beam_search", "unsupported_parameter"),
    ({**CHAT, "chat_template": "{{ x }}"}, 400, "chat_template", "unsupported_parameter"),
    ({**CHAT, "echo": True}, 400, "echo", "unsupported_parameter"),
    ({**CHAT, "presence_penalty": -3}, 400, "presence_penalty", None),
    ({**CHAT, "whatever": 1}, 400, "whatever", "unknown_parameter"),
    ({**CHAT, "model": "other"}, 404, "model", "model_not_found"),
]


@pytest.mark.parametrize(("body", "status", "param", "code"), BAD_CHATS)
def test_bad_chat_requests(http, server, body, status, param, code):
    assert_openai_error(http.post(server.url + "/v1/chat/completions", json=body), status, param, code)


@pytest.mark.parametrize("raw", [b"{bad json", b"[1, 2]", b"", b"\xff\xfe", b'"just a string"'])
def test_malformed_bodies_are_400(http, server, raw):
    response = http.post(server.url + "/v1/completions", content=raw, headers={"Content-Type": "application/json"})
    assert_openai_error(response, 400)


def test_unknown_route_and_method(http, server):
    assert_openai_error(http.get(server.url + "/v1/nothing"), 404, code="not_found")
    assert_openai_error(http.get(server.url + "/v1/completions"), 405)
    assert_openai_error(http.get(server.url + "/v1/models/gpt-4"), 404, "model", "model_not_found")


def test_api_key_is_required_on_v1_routes_only(http, guarded_server):
    url = guarded_server.url
    assert_openai_error(http.post(url + "/v1/completions", json=COMPLETION), 401, code="invalid_api_key")
    wrong = {"Authorization": "Bearer nope"}
    assert_openai_error(http.post(url + "/v1/completions", json=COMPLETION, headers=wrong), 401)
    # A bad key is refused before the body is read: malformed JSON still gets 401, not 400.
    assert_openai_error(http.post(url + "/v1/completions", content=b"{", headers=wrong), 401)
    right = {"Authorization": f"Bearer {API_KEY}"}
    assert http.post(url + "/v1/completions", json=COMPLETION, headers=right).status_code == 200
    for path in ("/health", "/ready", "/metrics"):
        assert http.get(url + path).status_code == 200


def test_bodies_over_the_limit_are_413(http, guarded_server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    big = {**COMPLETION, "prompt": "x" * 5000}
    url = guarded_server.url + "/v1/completions"
    assert_openai_error(http.post(url, json=big, headers=headers), 413, code="request_too_large")

    def chunked():  # no Content-Length: the limit is counted as the body arrives
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    assert_openai_error(http.post(url, content=chunked(), headers=headers), 413, code="request_too_large")


def test_queue_full_is_429_with_retry_after(http, guarded_server):
    """The guarded server holds one sequence: while one stream runs, the next request is refused."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = guarded_server.url + "/v1/completions"
    long = {**COMPLETION, "max_tokens": CONTEXT - 8, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=60, headers=headers) as client:
        with client.stream("POST", url, json=long) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()  # keep a reference: a dropped line iterator closes the stream
            next(lines)  # admitted and running
            refused = client.post(url, json=COMPLETION)
            assert_openai_error(refused, 429, code="queue_full")
            assert refused.headers["Retry-After"] == "1"
        # The stream was closed early: its slot comes back, and requests are admitted again.
        for _ in range(200):
            again = client.post(url, json=COMPLETION)
            if again.status_code != 429:
                break
        assert again.status_code == 200, again.text
