"""One slow stream does not take a healthy replica down (a real gateway in front of a real replica).

A stream whose first chunk is legitimately late for its client (a stop string longer than the whole
answer holds every character back until the end) runs past the gateway's first-byte timeout (set
below the client's first-byte time) while four neighbours stream on the same replica. The replica
tells the gateway each generated token's ids as it goes (SSE comments the gateway asks for, to
resume streams: tandem.edge.resume_wire), so the gateway sees it working: the held stream is not
cut but answered whole (200, one [DONE]); the neighbours finish with `data: [DONE]` and no error
event; the replica is not declared unresponsive and the breaker stays closed. The timeout is set
from the held stream's own first-byte time measured in this test (half of it), so a loaded machine
changes both alike. The replica's every step takes at least DELAY_MS (the
gate's `slow-steps` test optimizer), so the held stream (as many tokens as the longest stop string a
replica takes can hold back) is late by seconds while a neighbour's first byte needs a step or two.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .harness import MODEL_NAME, RunningGateway, metric, variant

pytestmark = pytest.mark.slow

TOKENS = 200  # the held stream's length at most (about 2.6 s of steps alone here)
PROBE_TOKENS = 100  # enough to learn the model's characters per token
NEIGHBOURS = 4
DELAY_MS = 10
STOP_CHARS = 1024  # the longest stop string a replica takes (tandem.serve.bounds)


def held(stop_chars: int, tokens: int = TOKENS) -> dict:
    """A stream whose text is all held back: its stop string (never matched) is longer than the answer."""
    return {
        "model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True, "stream": True,
        "temperature": 0, "stop": "\u2603" * stop_chars,
    }  # fmt: skip


def neighbour(tokens: int = TOKENS) -> dict:
    return {"model": MODEL_NAME, "prompt": "In a land far away", "max_tokens": tokens, "ignore_eos": True,
            "stream": True, "temperature": 0}  # fmt: skip


def stream(client: httpx.Client, body: dict) -> tuple[int, str, float | None, float]:
    """(status, text, seconds to the first chunk, seconds in all)."""
    started = time.monotonic()
    first = None
    with client.stream("POST", "/v1/completions", json=body) as r:
        text = ""
        for chunk in r.iter_text():
            if first is None and chunk:
                first = time.monotonic() - started
            text += chunk
    return r.status_code, text, first, time.monotonic() - started


def test_a_held_stream_past_the_first_byte_timeout_is_served_whole_while_four_neighbours_finish(
    serve_model_dir, tmp_path, plugins, monkeypatch
):
    monkeypatch.setenv("PYTHONPATH", str(plugins))  # the replica finds `slow-steps` by its entry point
    raw = {
        "model": str(serve_model_dir), "threads": 1, "variants": [variant("fast", f"slow-steps(delay_ms={DELAY_MS})")],
        "policy": {"name": "hpa", "interval_s": 0.5},
        "breaker": {"consecutive_failures": 1, "failure_ratio": 0.01, "min_calls": 1, "window_s": 60, "open_s": 60},
    }  # fmt: skip
    gw = RunningGateway(raw, tmp_path / "logs", first_byte_timeout_s=120.0, stream_idle_timeout_s=120.0)
    try:
        gw.wait_ready("fast")
        with httpx.Client(base_url=gw.url, timeout=180) as client:
            probe = client.post("/v1/completions", json={**held(1, PROBE_TOKENS), "stream": False, "stop": None})
            assert probe.status_code == 200, probe.text
            # As many tokens as a stop string of the longest length a replica takes can hold back.
            chars = len(probe.json()["choices"][0]["text"])
            tokens = min(TOKENS, (STOP_CHARS - 64) * PROBE_TOKENS // max(chars, 1))
            prefix = client.post("/v1/completions", json={**held(1, tokens), "stream": False, "stop": None})
            stop_chars = len(prefix.json()["choices"][0]["text"]) + 64
            assert stop_chars <= STOP_CHARS, (chars, tokens, stop_chars)
            slow = held(stop_chars, tokens)
            status, text, first, total = stream(client, slow)
            assert status == 200 and text.endswith("data: [DONE]\n\n") and first is not None
            assert first > 0.8 * total, (first, total)  # the whole answer was held back to its end
            _, _, quick, _ = stream(client, neighbour(8))  # only its first byte counts
        assert quick is not None and quick < first / 3, (quick, first)  # a neighbour's first byte is much earlier
        gw.gw.upstream.first_byte_timeout_s = first / 2

        results: dict[str, tuple] = {}

        def run(name: str, body: dict) -> None:
            with httpx.Client(base_url=gw.url, timeout=180) as own:
                results[name] = stream(own, body)

        # Half as many again as the held stream's tokens: still streaming when it times out.
        threads = [
            threading.Thread(target=run, args=(f"n{i}", neighbour(tokens + tokens // 2))) for i in range(NEIGHBOURS)
        ]
        threads.append(threading.Thread(target=run, args=("slow", slow)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        status, text, _, seconds = results["slow"]
        # Held back for its client, yet the replica's token ids showed progress: answered whole, not cut.
        assert status == 200 and text.endswith("data: [DONE]\n\n") and '"error"' not in text, text[-400:]
        for i in range(NEIGHBOURS):
            n_status, n_text, _, n_seconds = results[f"n{i}"]
            assert n_status == 200 and n_text.endswith("data: [DONE]\n\n") and '"error"' not in n_text, n_text[-400:]
        assert seconds > first / 2  # it did run past the first-byte timeout
        assert gw.gw.upstream.liveness.unresponsive == {}
        text = gw.metrics()
        assert metric(text, "tandem:breaker_state", variant="fast") == 0
        assert metric(text, "tandem:gateway_stream_errors_total", variant="fast") == 0
        gw.settled()
        print(
            f"held stream: first byte {first:.1f} s alone, timeout {first / 2:.1f} s, served whole in {seconds:.1f} s; "
            f"neighbours {sorted(round(results[f'n{i}'][3], 1) for i in range(NEIGHBOURS))} s, all complete"
        )
    finally:
        gw.stop()
