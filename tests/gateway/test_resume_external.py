"""A stream from an external engine (the stand-in OpenAI server, its own process) whose engine is
killed mid-way resumes on the other replica by text continuation: one stream, the whole answer."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest

from .harness import MODEL_NAME, RunningGateway, metric, wait_for
from .test_external_variants import engine_pid, external

pytestmark = pytest.mark.slow

TOKENS = 60


def test_a_killed_external_engine_s_stream_resumes_by_text_continuation(serve_model_dir, tmp_path):
    ext = external(lo=2, hi=2)
    ext["command"] = [("0.05" if arg == "0.01" else arg) for arg in ext["command"]]  # 3 s streams
    raw = {"model": str(serve_model_dir), "threads": 1, "variants": [ext],
           "policy": {"name": "hpa", "interval_s": 0.5, "params": {"target": 100}}}  # fmt: skip
    gw = RunningGateway(raw, tmp_path / "logs")
    try:
        gw.wait_ready("ext", count=2)
        events, raw_text = [0], []
        body = {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": TOKENS, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip

        def client() -> None:
            with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    raw_text.append(line)
                    events[0] += '"text"' in line

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        wait_for(lambda: events[0] >= 10, 30, "the stream under way")
        busy = next(rid for rid, n in gw.gw.fleet.inflight.running.items() if n)
        os.kill(engine_pid(gw.backend.pid(busy)), signal.SIGKILL)
        thread.join(60)
        lines = [line for line in raw_text if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and sum(line == "data: [DONE]" for line in lines) == 1
        assert not any('"error"' in line for line in lines), lines[-3:]
        events_ = [json.loads(line[6:]) for line in lines[:-1]]
        text = "".join(c.get("text") or "" for e in events_ for c in e.get("choices") or ())
        assert text == "".join(f" tok{i}" for i in range(TOKENS))
        usage = next(e["usage"] for e in reversed(events_) if e.get("usage"))
        assert usage["completion_tokens"] == TOKENS and usage["prompt_tokens"] == 3
        assert len({e["id"] for e in events_}) == 1  # one stream's id throughout
        assert metric(gw.metrics(), "tandem:gateway_resumes_total", variant="ext", reason="unreachable") == 1
        gw.settled()
    finally:
        gw.stop()
