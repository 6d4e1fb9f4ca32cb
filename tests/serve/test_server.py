"""The server process: startup banner, graceful SIGTERM (stop admitting, finish in-flight, exit 0), the
shutdown deadline (streams end with an error event and [DONE]), and a model that fails to load."""

from __future__ import annotations

import json
import time

import httpx
from server_process import ServerProcess

from tandem.edge.settings import Settings
from tandem.serve import run_server
from tandem.serve.server import client_host, startup_banner

from .conftest import CONTEXT, MODEL_NAME, server_args

LONG = {"model": MODEL_NAME, "prompt": "a", "max_tokens": CONTEXT - 8, "ignore_eos": True, "stream": True}


def test_the_startup_log_shows_url_model_recipe_and_a_curl_example(server):
    log = server.log()
    assert f"ready at {server.url}" in log
    assert f"model:  {MODEL_NAME}" in log and "recipe: baseline" in log
    assert f"curl {server.url}/v1/completions" in log and f'"model": "{MODEL_NAME}"' in log


def test_the_banner_never_prints_the_api_key_and_names_a_reachable_host(server):
    class Served:
        name, path, recipe, max_model_len, num_slots = "m", "/models/m", "bf16", 512, 4
        sampling_defaults = {"temperature": 0.0}

    banner = startup_banner(Settings(host="0.0.0.0", api_key="s3cret"), Served(), 9000)
    assert "s3cret" not in banner and "$TANDEM_API_KEY" in banner and "http://127.0.0.1:9000" in banner
    threads = startup_banner(Settings(threads=3), Served(), 9000)
    assert (
        "recipe: bf16" in threads and "threads: 3 torch threads, OMP_WAIT_POLICY" in threads and "port 9000" in threads
    )
    assert client_host("::") == "[::1]" and client_host("10.0.0.2") == "10.0.0.2"


def _refused(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/models", timeout=10).status_code == 503
    except httpx.TransportError:
        return True


def test_sigterm_drains_in_flight_requests_and_cuts_at_the_deadline(serve_model_dir, tmp_path):
    graceful = ServerProcess(server_args(serve_model_dir), tmp_path / "graceful.log")
    hasty = ServerProcess(server_args(serve_model_dir, "--shutdown-timeout", "0"), tmp_path / "hasty.log")
    try:
        for server in (graceful.wait_ready(), hasty.wait_ready()):
            with (
                httpx.Client(timeout=60) as client,
                client.stream("POST", server.url + "/v1/completions", json=LONG) as stream,
            ):
                lines = (line for line in stream.iter_lines() if line)
                seen = [next(lines)]  # admitted and streaming
                server.terminate()
                deadline = time.monotonic() + 30
                while not _refused(server.url):  # stops admitting while the stream is still running
                    assert time.monotonic() < deadline
                seen += list(lines)
            assert seen[-1] == "data: [DONE]"
            assert server.wait() == 0
            last = json.loads(seen[-2].removeprefix("data: "))
            if server is graceful:  # finished in full
                assert last["choices"][0]["finish_reason"] == "length"
                assert "SIGTERM: admitting no new requests" in server.log()
            else:  # cut at the deadline, and told so
                assert last["error"]["code"] == "shutting_down"
            assert "Traceback" not in server.log()
    finally:
        graceful.stop()
        hasty.stop()


def test_a_model_that_fails_to_load_ends_the_server_with_exit_code_1(tmp_path, caplog):
    (tmp_path / "config.json").write_text("{}")
    code = run_server(Settings(model=str(tmp_path), port=0))
    assert code == 1
    assert any("cannot serve the model" in r.getMessage() for r in caplog.records)
