"""`tandem profile --endpoint`: a black-box Profile of a running OpenAI-compatible server (here a
stand-in server process, tests/fake_openai_server.py; llama.cpp's in tests/gateway/test_llamacpp_variant.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_process import free_port

from tandem.contracts import Profile
from tandem.measure.endpoint import EndpointError, StreamTiming, decode_rate, measure_endpoint

FAKE = str(Path(__file__).parents[1] / "fake_openai_server.py")


def test_streams_decoding_together_add_up():
    streams = [StreamTiming(1.0, 2.0, 101), StreamTiming(1.1, 2.1, 51), StreamTiming(1.05, 2.0, 96)]
    assert decode_rate(streams) == pytest.approx(100 + 50 + 95 / 0.95)


def test_streams_served_one_after_another_are_timed_over_their_span():
    # A server that runs one request at a time (llama-cpp-python): no moment when all decode together.
    streams = [StreamTiming(0.0, 1.0, 101), StreamTiming(1.1, 2.1, 101), StreamTiming(2.2, 3.2, 101)]
    assert decode_rate(streams) == pytest.approx(300 / 3.2)


def test_streams_without_two_tokens_cannot_time_decoding():
    with pytest.raises(EndpointError, match="two output tokens"):
        decode_rate([StreamTiming(1.0, 1.0, 1)])


@pytest.fixture
def fake_server(tmp_path):
    port = free_port()
    env = {**os.environ, "API_KEY": "k3y"}
    proc = subprocess.Popen(
        [sys.executable, FAKE, "--port", str(port), "--served-model-name", "fake-7b", "--token-delay-s", "0.01"],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(10)


def test_a_running_server_is_measured_black_box(fake_server):
    lines: list[str] = []
    profile = measure_endpoint(
        fake_server, concurrency=(1, 4), new_tokens=24, api_key="k3y", hardware="h100-80gb", progress=lines.append
    )
    assert profile == Profile.from_json(profile.to_json())
    assert (profile.model, profile.recipe, profile.hardware) == ("fake-7b", "external:fake-7b", "h100-80gb")
    # The stand-in writes a token every 10 ms per request and serves requests in parallel.
    one, four = profile.decode_tokens_per_s[1], profile.decode_tokens_per_s[4]
    assert 30 < one < 200 and four > 2.5 * one, profile.decode_tokens_per_s  # events coalesce in reads: not exact
    assert profile.max_slots == 4 and profile.ttft_s_p50 > 0.005 and profile.prefill_tokens_per_s > 0
    assert (
        profile.source == "measured" and "black-box" in profile.source_note and profile.extra["method"] == "black-box"
    )
    assert profile.weight_bytes == 0 and "cold start not measured" in profile.source_note
    assert any(line.startswith("decode at concurrency 4") for line in lines)


def test_the_cli_writes_the_profile_and_refuses_what_it_cannot_measure(fake_server, tmp_path):
    out = tmp_path / "p.json"
    env = {**os.environ, "TANDEM_ENDPOINT_API_KEY": "k3y"}
    done = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "profile", "--endpoint", fake_server, "--concurrency", "1,2",
         "--cold-start-s", "45", "-o", str(out)], capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    profile = Profile.from_json(out.read_text())
    assert profile.cold_start_s == 45 and "cold start 45 s as given" in profile.source_note
    assert "torch" not in subprocess.run(
        [sys.executable, "-c", "import sys, tandem.measure.endpoint; print(sorted(sys.modules))"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    wrong_key = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "profile", "--endpoint", fake_server, "--api-key", "nope"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert wrong_key.returncode == 1 and "401: give its key" in wrong_key.stderr and "Traceback" not in wrong_key.stderr
    gone = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "profile", "--endpoint", f"http://127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert gone.returncode == 1 and "cannot reach" in gone.stderr and "Traceback" not in gone.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "profile", "--endpoint", fake_server, "--concurrency", "0,x"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 1 and "--concurrency" in bad.stderr
