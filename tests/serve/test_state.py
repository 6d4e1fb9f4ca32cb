"""A replica without its model: while the model loads every model route is a 503 `model_loading` with
Retry-After (GET /health stays 200, /ready says "loading"); after a failed load each is a 503
`model_load_failed` naming the error; once loaded the same requests are served.

In process (Starlette's TestClient around the real app), with the load function held or failing.
"""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from tandem.edge.settings import Settings
from tandem.model import ModelLoadError
from tandem.serve import create_app, load_served_model

MODEL_ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/tiny", None),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "def add", "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/tokenize", {"prompt": "def add"}),
    ("POST", "/detokenize", {"tokens": [1, 2]}),
]


def settings(model: str) -> Settings:
    return Settings(model=model, served_model_name="tiny", max_model_len=64, max_num_seqs=2, threads=1)


def wait_until(condition, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def assert_503(response, code: str) -> dict:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    return error


@pytest.mark.parametrize(("method", "path", "body"), MODEL_ROUTES)
def test_while_the_model_loads_its_routes_are_503_model_loading_then_served(tiny_llama_dir, method, path, body):
    config = settings(str(tiny_llama_dir))
    release = threading.Event()

    def load():
        assert release.wait(120), "the test never released the load"
        return load_served_model(config, created=0)

    with TestClient(create_app(config, load), raise_server_exceptions=False) as client:
        try:
            loading = client.request(method, path, json=body)
            error = assert_503(loading, "model_loading")
            assert "still loading" in error["message"] and loading.headers["retry-after"] == "1"
            assert client.get("/health").status_code == 200
            ready = client.get("/ready")
            assert ready.status_code == 503 and ready.json() == {"status": "loading", "error": None}
            assert client.get("/load").json()["healthy"] is False
        finally:
            release.set()
        wait_until(lambda: client.get("/ready").status_code == 200, "the model to be served")
        served = client.request(method, path, json=body)
        assert served.status_code == 200, served.text
        assert client.get("/load").json()["healthy"] is True


def test_after_a_failed_load_every_model_route_is_503_model_load_failed_naming_the_error():
    config = settings("/nonexistent/model")
    fatal: list[str] = []

    def load():
        raise ModelLoadError("config.json: 'num_attention_heads' must be a positive integer")

    app = create_app(config, load, on_fatal=fatal.append)
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_until(lambda: client.get("/ready").json()["status"] == "failed", "the load to fail")
        why = "config.json: 'num_attention_heads' must be a positive integer"
        assert fatal == [why]
        assert client.get("/ready").json() == {"status": "failed", "error": why}
        assert client.get("/health").status_code == 200
        for method, path, body in MODEL_ROUTES:
            response = client.request(method, path, json=body)
            error = assert_503(response, "model_load_failed")
            assert error["message"] == f"the model failed to load: {why}", (path, error)
            assert "retry-after" not in response.headers, path  # retrying will not help
