"""The served model's sampling defaults: omitted request fields follow the model's generation_config.json
(vLLM's --generation-config auto), and --generation-config vllm restores the OpenAI API's. A real app
and engine in process, on a tiny model whose generation config sets every field tandem reads."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from tiny_models import save_tiny

from tandem.edge.settings import Settings
from tandem.serve import create_app, load_served_model
from tandem.serve.server import describe_defaults

from .conftest import GENERATION_CONFIG

DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "top_k": 7, "min_p": 0.02, "repetition_penalty": 1.3, "max_tokens": 9}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = save_tiny("llama", tmp_path_factory.mktemp("gen") / "tiny-gen")
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, **GENERATION_CONFIG}))
    return path


@contextmanager
def serving(model_dir, generation_config: str):
    config = Settings(model=str(model_dir), recipe="baseline", threads=1, generation_config=generation_config)
    with TestClient(create_app(config, lambda: load_served_model(config, created=0))) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield client


def complete(client, **fields) -> dict:
    response = client.post("/v1/completions", json={"model": "tiny-gen", "prompt": "def add", **fields})
    assert response.status_code == 200, response.text
    return response.json()


EXPLICIT = {k: v for k, v in DEFAULTS.items() if k != "max_tokens"}


def test_omitted_fields_follow_generation_config_json(model_dir):
    with serving(model_dir, "auto") as client:
        assert client.get("/v1/models").json()["data"][0]["sampling_defaults"] == DEFAULTS
        omitted = complete(client, seed=11, ignore_eos=True)
        assert omitted["usage"]["completion_tokens"] == 9  # max_new_tokens
        # The same text as a request spelling out the file's values, and not the OpenAI defaults'.
        spelled = complete(client, seed=11, ignore_eos=True, max_tokens=9, **EXPLICIT)
        assert omitted["choices"][0]["text"] == spelled["choices"][0]["text"]
        openai_defaults = complete(
            client, seed=11, ignore_eos=True, max_tokens=9, temperature=1, top_p=1, top_k=-1, min_p=0,
            repetition_penalty=1,
        )  # fmt: skip
        assert openai_defaults["choices"][0]["text"] != omitted["choices"][0]["text"]
        chat = client.post(
            "/v1/chat/completions",
            json={"model": "tiny-gen", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True},
        )
        assert chat.json()["usage"]["completion_tokens"] == 9
    assert "temperature=0.6" in describe_defaults(DEFAULTS, "auto") and "generation_config.json" in describe_defaults(
        DEFAULTS, "auto"
    )


def test_generation_config_vllm_restores_the_openai_defaults(model_dir):
    with serving(model_dir, "vllm") as client:
        assert client.get("/v1/models").json()["data"][0]["sampling_defaults"] == {}
        omitted = complete(client, seed=11, ignore_eos=True)
        assert omitted["usage"]["completion_tokens"] == 16  # OpenAI's completions default
        spelled = complete(client, seed=11, ignore_eos=True, max_tokens=16, temperature=1, top_p=1, top_k=0)
        assert omitted["choices"][0]["text"] == spelled["choices"][0]["text"]
        # Given fields are the same under either setting.
        assert complete(client, seed=11, ignore_eos=True, max_tokens=9, **EXPLICIT)["usage"]["completion_tokens"] == 9
    assert "--generation-config vllm" in describe_defaults({}, "vllm")


def test_a_generation_config_value_the_engine_refuses_is_skipped_not_fatal(tmp_path, caplog):
    path = save_tiny("llama", tmp_path / "odd")
    config = json.loads((path / "generation_config.json").read_text())
    odd = {"do_sample": True, "temperature": 0.5, "repetition_penalty": 0.0, "top_p": 7}
    (path / "generation_config.json").write_text(json.dumps({**config, **odd}))
    served = load_served_model(Settings(model=str(path), recipe="baseline", threads=1), created=0)
    try:
        assert dict(served.sampling_defaults) == {"temperature": 0.5}
    finally:
        served.shutdown()
    assert "repetition_penalty must be" in caplog.text and "top_p must be" in caplog.text
