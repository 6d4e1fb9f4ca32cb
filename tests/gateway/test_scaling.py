"""The gateway over loopback with the local backend: a burst scales 1 -> 3 replicas and back to 1."""

from __future__ import annotations

import httpx
import pytest

from .harness import MODEL_NAME, Load, RunningGateway, metric, variant, wait_for


@pytest.mark.slow
def test_a_burst_scales_up_and_back_down_with_no_failed_request(serve_model_dir, tmp_path):
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [variant("fast", lo=1, hi=3)],
        "policy": {
            "name": "hpa",
            "interval_s": 0.5,
            "params": {"target": 2, "scale_down_stabilization_s": 3},
            "limits": {"max_scale_down_rate": 10},
        },
        "controller": {"drain_timeout_s": 30},
    }
    gw = RunningGateway(raw, tmp_path / "logs")
    try:
        gw.wait_ready("fast")
        # The same API as a plain server.
        models = httpx.get(gw.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [MODEL_NAME]
        assert httpx.get(gw.url + "/ready", timeout=10).status_code == 200
        r = httpx.post(
            gw.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4}, timeout=60
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1

        load = Load(gw.url, workers=8, stream=lambda n: n % 2 == 0, max_tokens=48)
        try:
            gw.wait_ready("fast", count=3, timeout=120)
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [] and outcomes.broken_mid_stream == []
        assert outcomes.ok >= 8
        gw.settled()

        def back_to_one() -> bool:
            fleet = gw.backend.list()
            return len(fleet) == 1 and fleet[0].state == "ready" and not gw.backend.stopping

        wait_for(back_to_one, 60, "the fleet to shrink back to one replica")
        text = gw.metrics()
        assert metric(text, "tandem:scale_decisions_total", policy="hpa", direction="up") >= 1
        assert metric(text, "tandem:scale_decisions_total", policy="hpa", direction="down") >= 1
        assert metric(text, "tandem:replicas", variant="fast", state="ready") == 1
        assert all(r.exit_code == 0 for r in gw.backend.exited), gw.backend.exited  # drained, then SIGTERM
        assert gw.errors() == 0
    finally:
        gw.stop()
