"""Fuzz: hypothesis-generated request bodies (valid, nearly valid and nonsense) never get a 5xx.

Runs in process (Starlette's TestClient around the real app and a real engine on the tiny model,
context 48, so a valid request is cheap); every error must be an OpenAI-style body, every stream
must end with [DONE] and carry no server error, and every 200 must be the whole response its route
promises for that request (the OpenAI client's types, one choice per n and prompt, usage that adds up).
"""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tandem.edge.settings import Settings
from tandem.serve import create_app, load_served_model
from tandem.serve.schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


# Plausible values, a few of them just out of range (context 48, n <= 16, temperature <= 2, ...).
COMMON = {
    "max_tokens": st.integers(0, 50),
    "temperature": st.floats(0, 2.1),
    "top_p": st.floats(0, 1),
    "n": st.integers(0, 3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=5),
    "seed": st.integers(-1, 2**63),
    "ignore_eos": st.booleans(),
    "presence_penalty": st.sampled_from([0, 0.0, 0.5, -2, 2.1]),
    "frequency_penalty": st.floats(-2.1, 2.1),
    "repetition_penalty": st.floats(0, 3),
    "logit_bias": st.dictionaries(
        st.text(max_size=4) | st.integers(0, 400).map(str), st.floats(-101, 101) | st.just(float("-inf")), max_size=3
    ),
    "min_tokens": st.integers(0, 60),
    "min_p": st.floats(0, 1.1),
    "bad_words": st.lists(st.text(max_size=6), max_size=3),
    "top_k": st.integers(-2, 400),
    "use_beam_search": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "user": st.text(max_size=5),
}
PROMPT = (
    st.text(max_size=80)
    | st.lists(st.integers(0, 330), min_size=1, max_size=50)
    | st.lists(st.text(max_size=20), min_size=1, max_size=3)
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "robot"])},
    optional={
        "content": st.text(max_size=60)
        | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.text()})),
        "name": st.text(max_size=5),
    },
)


@st.composite
def bodies(draw, required: dict, optional: dict) -> dict:
    """A plausible body, then up to two fields dropped or replaced by arbitrary JSON."""
    body = draw(st.fixed_dictionaries(required, optional=optional))
    for key in draw(st.lists(st.sampled_from(sorted({*required, *optional})), max_size=2, unique=True)):
        if draw(st.booleans()):
            body.pop(key, None)
        else:
            body[key] = draw(JSON)
    return body


MODEL = st.sampled_from(["tiny"] * 8 + ["other"])
COMPLETION_BODY = bodies(
    {"model": MODEL, "prompt": PROMPT}, {**COMMON, "logprobs": st.integers(0, 21), "echo": st.booleans()}
)
CHAT_BODY = bodies(
    {"model": MODEL, "messages": st.lists(MESSAGE, min_size=1, max_size=3)},
    {
        **COMMON,
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 21),
        "max_completion_tokens": st.integers(0, 50),
    },
)


@pytest.fixture(scope="module", params=["baseline", "int8+ngram"])
def client(request, tiny_llama_dir):
    """The plain path, and a quantized speculative one (several tokens per engine step)."""
    config = Settings(
        recipe=request.param,
        model=str(tiny_llama_dir),
        served_model_name="tiny",
        max_model_len=48,
        max_num_seqs=4,
        threads=1,
        max_body_bytes=8192,
    )
    app = create_app(config, lambda: load_served_model(config, created=0))
    with TestClient(app, raise_server_exceptions=False) as test_client:
        for _ in range(600):
            if test_client.get("/ready").status_code == 200:
                break
            time.sleep(0.05)
        yield test_client


def post(client: TestClient, path: str, body: dict):
    # Python's json writes NaN and Infinity as bare words; the server must refuse them, not crash.
    return client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})


def check(response, path: str, body: object = None) -> None:
    """No 5xx; an error is an OpenAI-style body; a 200 is the whole response `path` promises for `body`."""
    event(f"status {response.status_code}")  # --hypothesis-show-statistics shows the mix
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert isinstance(error["type"], str) and isinstance(error["code"], str), error
        return
    assert response.status_code == 200, response.status_code
    raw = json.loads(body) if isinstance(body, bytes) else body
    request = REQUESTS[path].model_validate(raw)  # the request as the server read it (n="2" is 2)
    if response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n")
        assert '"error"' not in response.text, response.text
        check_stream(response.text, request)
    else:
        SHAPES[path](response.json(), request)


def _choices_expected(request: CompletionRequest | ChatCompletionRequest) -> int:
    """n completions per prompt; a completions prompt that is a list of texts or of token lists is a batch."""
    prompt = getattr(request, "prompt", None)
    batch = isinstance(prompt, list) and isinstance(prompt[0], (str, list))
    return request.n * (len(prompt) if batch else 1)


def _check_usage(usage: dict, choices: int, request: CompletionRequest | ChatCompletionRequest) -> None:
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    assert usage["prompt_tokens"] >= 1 and usage["completion_tokens"] >= 0, usage
    limit = getattr(request, "max_completion_tokens", None) or request.max_tokens
    if limit is not None:
        assert usage["completion_tokens"] <= limit * choices, (usage, request)


def completion_shape(payload: dict, request: CompletionRequest) -> None:
    # The OpenAI client's own type, every field and its type; logprobs apart: an echoed prompt's first
    # token has a null logprob (as in OpenAI's legacy API and vLLM), which the client's type leaves out.
    Completion.model_validate({**payload, "choices": [{**c, "logprobs": None} for c in payload["choices"]]})
    assert payload["object"] == "text_completion" and payload["model"] == "tiny"
    assert payload["id"].startswith("cmpl-") and payload["created"] > 0
    choices = payload["choices"]
    assert [c["index"] for c in choices] == list(range(_choices_expected(request))), (choices, request)
    for choice in choices:
        assert choice["finish_reason"] in ("stop", "length") and isinstance(choice["text"], str), choice
        if request.logprobs is None:
            assert choice["logprobs"] is None, choice
        else:
            logprobs = choice["logprobs"]
            tokens, values = logprobs["tokens"], logprobs["token_logprobs"]
            assert len(tokens) == len(values) == len(logprobs["text_offset"]) == len(logprobs["top_logprobs"])
            assert all(isinstance(t, str) for t in tokens), logprobs
            unscored = 1 if request.echo and values else 0  # the prompt's first token
            assert all(v is None for v in values[:unscored]), logprobs
            assert all(isinstance(v, float) and v <= 0 for v in values[unscored:]), logprobs
    _check_usage(payload["usage"], len(choices), request)


def chat_shape(payload: dict, request: ChatCompletionRequest) -> None:
    ChatCompletion.model_validate(payload)
    assert payload["object"] == "chat.completion" and payload["model"] == "tiny"
    assert payload["id"].startswith("chatcmpl-") and payload["created"] > 0
    choices = payload["choices"]
    assert [c["index"] for c in choices] == list(range(request.n)), (choices, request)
    for choice in choices:
        assert choice["finish_reason"] in ("stop", "length"), choice
        assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
        if request.logprobs:
            assert isinstance(choice["logprobs"]["content"], list), choice
        else:
            assert choice["logprobs"] is None, choice
    _check_usage(payload["usage"], len(choices), request)


def tokenize_shape(payload: dict, request: TokenizeRequest) -> None:
    tokens = payload["tokens"]
    assert payload["count"] == len(tokens) and payload["max_model_len"] == 48, payload
    assert all(isinstance(t, int) and t >= 0 for t in tokens), payload
    if request.return_token_strs:
        assert len(payload["token_strs"]) == len(tokens), payload
    else:
        assert payload.get("token_strs") is None, payload


def detokenize_shape(payload: dict, request: DetokenizeRequest) -> None:
    assert set(payload) == {"prompt"} and isinstance(payload["prompt"], str), payload


REQUESTS = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
SHAPES = {
    "/v1/completions": completion_shape,
    "/v1/chat/completions": chat_shape,
    "/tokenize": tokenize_shape,
    "/detokenize": detokenize_shape,
}


def check_stream(text: str, request: CompletionRequest | ChatCompletionRequest) -> None:
    """Every event a chunk of one response: its type, one id, and exactly one finish per choice."""
    chat = isinstance(request, ChatCompletionRequest)
    object_name = "chat.completion.chunk" if chat else "text_completion"
    events = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 2, text
    chunks = [json.loads(e) for e in events[:-1]]
    expected = _choices_expected(request)
    finished: dict[int, str] = {}
    for chunk in chunks:
        if chat:
            ChatCompletionChunk.model_validate(chunk)
        else:  # the client reads these as Completion objects unvalidated: finish_reason is null until the end
            assert isinstance(chunk["created"], int) and all(isinstance(c["text"], str) for c in chunk["choices"])
        assert chunk["object"] == object_name and chunk["model"] == "tiny" and chunk["id"] == chunks[0]["id"]
        for choice in chunk["choices"]:
            assert 0 <= choice["index"] < expected and choice["index"] not in finished, (choice, request)
            if choice["finish_reason"] is not None:
                assert choice["finish_reason"] in ("stop", "length"), choice
                finished[choice["index"]] = choice["finish_reason"]
    assert sorted(finished) == list(range(expected)), (finished, request)
    if request.stream_options is not None and request.stream_options.include_usage:
        assert chunks[-1]["choices"] == [], chunks[-1]
        _check_usage(chunks[-1]["usage"], expected, request)
    else:
        assert all(chunk.get("usage") is None for chunk in chunks), chunks[-1]


FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@FUZZ
@given(body=COMPLETION_BODY)
def test_completions_never_fail_with_5xx(client, body):
    check(post(client, "/v1/completions", body), "/v1/completions", body)


@FUZZ
@given(body=CHAT_BODY)
def test_chat_completions_never_fail_with_5xx(client, body):
    check(post(client, "/v1/chat/completions", body), "/v1/chat/completions", body)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()),
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/nothing", "/tokenize"]),
)
def test_arbitrary_bytes_never_fail_with_5xx(client, raw, path):
    check(client.post(path, content=raw, headers={"Content-Type": "application/json"}), path, raw)


TOKENIZE_BODY = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["tiny", "other"]),
        "prompt": st.text(max_size=80) | JSON,
        "messages": st.lists(MESSAGE, max_size=3),
        "add_special_tokens": st.booleans() | JSON,
        "return_token_strs": st.booleans(),
        "tokens": st.lists(st.integers(-2, 400), max_size=20) | JSON,
        "add_generation_prompt": st.booleans(),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=TOKENIZE_BODY, path=st.sampled_from(["/tokenize", "/detokenize"]))
def test_tokenize_and_detokenize_never_fail_with_5xx(client, body, path):
    check(post(client, path, body), path, body)


def test_the_openapi_schema_describes_both_endpoints(client):
    schema = client.get("/openapi.json").json()
    paths = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/tokenize", "/detokenize"}
    assert paths | {"/version"} <= set(schema["paths"])
    fields = set(schema["components"]["schemas"]["CompletionRequest"]["properties"])
    assert {"repetition_penalty", "min_tokens", "min_p", "bad_words", "logit_bias", "presence_penalty"} <= fields
