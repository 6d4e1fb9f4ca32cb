"""POST /tokenize, POST /detokenize and GET /version on a real `tandem serve`, in vLLM's shapes; /tokenize
counts what the generation routes count."""

from __future__ import annotations

import httpx
import pytest

from tandem import __version__

from .conftest import API_KEY, CONTEXT, MODEL_NAME

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def test_tokenize_a_prompt_as_completions_count_it(http, tokenizer):
    out = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": "def add(a, b):"}).json()
    assert out["tokens"] == tokenizer.encode("def add(a, b):")
    assert out == {"count": len(out["tokens"]), "max_model_len": CONTEXT, "tokens": out["tokens"], "token_strs": None}
    usage = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 1})
    assert usage.json()["usage"]["prompt_tokens"] == out["count"]
    bare = http.post("/tokenize", json={"prompt": "def add(a, b):", "add_special_tokens": False}).json()  # no model
    assert bare["tokens"] == tokenizer.encode("def add(a, b):", add_special_tokens=False)


def test_tokenize_messages_as_chat_completions_count_them(http):
    out = http.post("/tokenize", json={"model": MODEL_NAME, "messages": MESSAGES, "return_token_strs": True}).json()
    chat = http.post("/v1/chat/completions", json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == out["count"] == len(out["tokens"])
    assert len(out["token_strs"]) == out["count"] and all(isinstance(s, str) for s in out["token_strs"])


def test_detokenize_inverts_tokenize(http, tokenizer):
    text = "class Point:\n    x = 1\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert http.post("/detokenize", json={"model": MODEL_NAME, "tokens": ids}).json() == {"prompt": text}
    with_bos = http.post("/detokenize", json={"tokens": [0, *ids]}).json()["prompt"]
    assert with_bos == "<s>" + text  # special tokens included, as vLLM


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"prompt": "x", "messages": MESSAGES}, 400, None),
        ("/tokenize", {}, 400, None),
        ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ x }}"}, 400, "chat_template"),
        ("/tokenize", {"prompt": "x", "add_bos": True}, 400, "add_bos"),
        ("/detokenize", {"tokens": [0, 10**6]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens[0]"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
    ],
)
def test_bad_token_requests_name_the_problem(http, path, body, status, param):
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_version(http):
    assert http.get("/version").json() == {"version": __version__}


def test_the_api_key_guards_tokenize_but_not_version(guarded_server):
    url = guarded_server.url
    assert httpx.post(url + "/tokenize", json={"prompt": "x"}).status_code == 401
    assert httpx.post(url + "/detokenize", json={"tokens": [1]}).status_code == 401
    auth = {"Authorization": f"Bearer {API_KEY}"}
    assert httpx.post(url + "/tokenize", json={"prompt": "x"}, headers=auth).status_code == 200
    assert httpx.get(url + "/version").status_code == 200
