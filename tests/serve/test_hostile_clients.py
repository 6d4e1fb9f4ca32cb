"""A replica under hostile or careless clients (real `tandem serve` processes on loopback):

- lone surrogates in a prompt or in chat content: a 400 naming the field, and the keep-alive
  connection carries the client's next request (it used to be a 500, then a dropped connection);
- an empty body: a 400 that says so;
- long prompts are tokenized off the event loop: /health answers while they are;
- a flood of thousands of half-sent connections (and of garbage requests): a new client is served
  within a second, the flood's connections are closed, and the log holds a few lines, not thousands;
- a model whose chat template never ends: each chat request is refused in about a second while
  /health keeps answering.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from flood import HealthWatch, flood_and_measure
from server_process import ServerProcess
from timing import within

from .conftest import MODEL_NAME, server_args

BOMB = (
    "{% for a in range(99999) %}{% for b in range(99999) %}{% for c in range(99999) %}"
    "{% endfor %}{% endfor %}{% endfor %}"
)


def local_port(response: httpx.Response) -> int:
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


def test_lone_surrogates_are_a_400_naming_the_field_and_the_connection_survives(server):
    bad = [
        ("/v1/completions", b'{"model": "tiny", "prompt": "\\ud800", "max_tokens": 2}', "prompt"),
        ("/v1/completions", b'{"model": "tiny", "prompt": ["ok", "a\\udfffb"], "max_tokens": 2}', "prompt[1]"),
        (
            "/v1/chat/completions",
            b'{"model": "tiny", "messages": [{"role": "user", "content": "hi \\ud83d"}], "max_tokens": 2}',
            "messages[0].content",
        ),
    ]
    good = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}
    ports = set()
    with httpx.Client(base_url=server.url, timeout=60, headers={"Content-Type": "application/json"}) as client:
        for round_ in range(4):
            for path, body, param in bad:
                r = client.post(path, content=body)
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert (error["param"], error["code"]) == (param, "invalid_unicode") and "surrogate" in error["message"]
                assert r.headers.get("connection") != "close"
                ports.add(local_port(r))
                ok = client.post("/v1/completions", json=good)
                assert ok.status_code == 200, (round_, ok.text)
                ports.add(local_port(ok))
    assert len(ports) == 1  # every request on the one keep-alive connection
    assert "Traceback" not in server.log()


def test_an_empty_body_says_so(server):
    r = httpx.post(server.url + "/v1/completions", content=b"", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "the request body is empty; send a JSON object"


def test_long_prompts_are_tokenized_off_the_event_loop(server):
    prompt = "def add(a, b):\n    return a + b\n" * 7000  # ~230k characters, far past the 1024-token context
    results: list[httpx.Response] = []

    def send() -> None:
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2}
        results.append(httpx.post(server.url + "/v1/completions", json=body, timeout=120))

    senders = [threading.Thread(target=send) for _ in range(4)]
    with HealthWatch(server.url) as watch:
        for t in senders:
            t.start()
        for t in senders:
            t.join()
    assert [r.status_code for r in results] == [400] * 4
    assert all(r.json()["error"]["code"] == "context_length_exceeded" for r in results)
    assert watch.worst < within(1.0), f"/health took {watch.worst:.2f} s while long prompts were tokenized"


@pytest.fixture(scope="module")
def fragile(serve_model_dir, tmp_path_factory):
    """A replica with a low connection cap and a short header deadline, serving a model whose chat template
    never ends."""
    root = tmp_path_factory.mktemp("fragile")
    model = root / "bomb-model"
    shutil.copytree(serve_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = BOMB
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    args = server_args(Path(model), "--max-connections", "400", "--header-timeout", "3", "--log-level", "info")
    process = ServerProcess(args, root / "fragile.log")
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def test_a_chat_template_bomb_is_refused_while_health_answers(fragile):
    outcomes: list[tuple[int, float, str]] = []

    def chat() -> None:
        started = time.monotonic()
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(fragile.url + "/v1/chat/completions", json=body, timeout=60)
        outcomes.append((r.status_code, time.monotonic() - started, r.json()["error"]["message"]))

    bombs = [threading.Thread(target=chat) for _ in range(3)]
    with HealthWatch(fragile.url) as watch:
        for t in bombs:
            t.start()
        for t in bombs:
            t.join()
    assert [status for status, _, _ in outcomes] == [400] * 3
    assert all("rendering took longer than 1 s" in message for _, _, message in outcomes), outcomes
    assert max(seconds for _, seconds, _ in outcomes) < within(10), outcomes
    assert watch.worst < within(1.0), f"/health took {watch.worst:.2f} s during the template bomb"
    # Completions (no template) are untouched.
    r = httpx.post(fragile.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "a", "max_tokens": 2})
    assert r.status_code == 200


@pytest.mark.slow
def test_a_connection_flood_locks_no_client_out_and_floods_no_log(fragile):
    host, port = "127.0.0.1", fragile.port
    lines_before = len(fragile.log().splitlines())
    garbage = []
    try:
        for _ in range(500):  # garbage first: uvicorn logs "Invalid HTTP request received." for each
            sock = socket.create_connection((host, port))
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            garbage.append(sock)
        seen = flood_and_measure(fragile.url, port)  # 3,000 half-sent connections (7.5x the cap), then more
        r = httpx.post(fragile.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "a", "max_tokens": 2})
        assert r.status_code == 200
    finally:
        for sock in garbage:
            sock.close()
    assert max(seen["new_client_s"]) < within(1.0), seen
    assert seen["left_open"] <= 50, seen  # past the 3 s header deadline the server closed them
    log = fragile.log().splitlines()[lines_before:]
    assert len(log) < 40, "\n".join(log[:60])  # thousands of bad connections, a few lines
    assert any("connections closed since the last report" in line for line in log)
    assert any("similar messages suppressed" in line for line in log) or len(log) < 15
    assert not any("Traceback" in line for line in log)
