"""Fuzz: hypothesis-generated request bodies (valid, nearly valid and nonsense) never get a 5xx.

Runs in process (Starlette's TestClient around the real app and a real engine on the tiny model,
context 48, so a valid request is cheap); every error must be an OpenAI-style body, every stream
must end with [DONE] and carry no server error.
"""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tandem.edge.settings import Settings
from tandem.serve import create_app, load_served_model

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


def check(response, ok_field: str = "choices") -> None:
    event(f"status {response.status_code}")  # --hypothesis-show-statistics shows the mix
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n")
        assert '"error"' not in response.text, response.text
    else:
        assert ok_field in response.json()


FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@FUZZ
@given(body=COMPLETION_BODY)
def test_completions_never_fail_with_5xx(client, body):
    check(post(client, "/v1/completions", body))


@FUZZ
@given(body=CHAT_BODY)
def test_chat_completions_never_fail_with_5xx(client, body):
    check(post(client, "/v1/chat/completions", body))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()),
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/nothing", "/tokenize"]),
)
def test_arbitrary_bytes_never_fail_with_5xx(client, raw, path):
    check(client.post(path, content=raw, headers={"Content-Type": "application/json"}), "count")


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
    check(post(client, path, body), "count" if path == "/tokenize" else "prompt")


def test_the_openapi_schema_describes_both_endpoints(client):
    schema = client.get("/openapi.json").json()
    paths = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ready", "/tokenize", "/detokenize"}
    assert paths | {"/version"} <= set(schema["paths"])
    fields = set(schema["components"]["schemas"]["CompletionRequest"]["properties"])
    assert {"repetition_penalty", "min_tokens", "min_p", "bad_words", "logit_bias", "presence_penalty"} <= fields
