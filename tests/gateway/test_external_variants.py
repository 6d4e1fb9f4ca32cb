"""An external engine as a variant through the gateway, next to a tandem variant: a stand-in
OpenAI-compatible server process (tests/fake_openai_server.py, not tandem) started from its
command template. Routing, its load read from its vLLM-style metrics, the fleet secret through
`{api_key}`, scale 1 -> 2 -> 1, and fallback to the tandem variant when its processes are killed.
The same with llama.cpp's real server: tests/gateway/test_llamacpp_variant.py."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess

from .harness import MODEL_NAME, Load, RunningGateway, metric, variant, wait_for

FAKE = str(Path(__file__).parents[1] / "fake_openai_server.py")


def external(lo: int = 1, hi: int = 2) -> dict:
    return {
        "name": "ext",
        "engine": "external",
        "command": [
            sys.executable,
            FAKE,
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--token-delay-s",
            "0.01",
            "--served-model-name",
            "{served_model_name}",
        ],
        "env": {"API_KEY": "{api_key}"},  # it demands the fleet's bearer token, as vLLM with VLLM_API_KEY
        "metrics": {"adapter": "vllm"},
        "replicas": {"min": lo, "max": hi},
    }


def beside_a_tandem_fallback(ext: dict, target: int, **more) -> dict:
    """A deployment: the external variant `ext` first, a tandem variant "cpu" its fallback; hpa scaling
    at `target` requests a replica, back down 3 s after the load stops."""
    return {
        "threads": 1,
        "variants": [ext, variant("cpu")],
        "fallback": "cpu",
        "policy": {
            "name": "hpa",
            "interval_s": 0.5,
            "params": {"target": target, "scale_down_stabilization_s": 3},
            "limits": {"max_scale_down_rate": 10},
        },
        "controller": {"drain_timeout_s": 60},
        **more,
    }


def engine_pid(tether_pid: int) -> int:
    """The server a tether runs (its only child)."""
    (child,) = Path(f"/proc/{tether_pid}/task/{tether_pid}/children").read_text().split()
    return int(child)


def completion(url: str, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 6, "stream": stream}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


@pytest.mark.slow
def test_an_external_variant_serves_scales_reports_its_load_and_falls_back(serve_model_dir, tmp_path):
    raw = beside_a_tandem_fallback(external(), target=2, model=str(serve_model_dir))
    gw = RunningGateway(raw, tmp_path / "logs")
    try:
        gw.wait_ready("ext")
        gw.wait_ready("cpu")
        answer = completion(gw.url)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"].startswith(" tok0"), answer.text

        def ext_view() -> dict | None:
            view = httpx.get(gw.url + "/admin/replicas", timeout=10).json()
            return next((r for r in view["replicas"] if r["variant"] == "ext" and r["load"]), None)

        seen = wait_for(ext_view, 20, "a load report of the external replica")
        assert seen["engine"] == "external" and seen["load"]["source"] == "vllm"
        assert seen["routing"]["source"] == "vllm" and seen["recipe"] is None

        load = Load(gw.url, workers=6, stream=lambda n: n % 2 == 0, max_tokens=40)
        try:
            gw.wait_ready("ext", count=2, timeout=60)  # 1 -> 2 on its own metrics
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [] and outcomes.broken_mid_stream == []

        def one_ext() -> bool:
            return sum(1 for r in gw.backend.list() if r.variant == "ext") == 1 and not gw.backend.stopping

        wait_for(one_ext, 60, "the external variant to shrink back to one replica")  # 2 -> 1
        assert all(r.exit_code == 0 for r in gw.backend.exited if r.variant == "ext"), gw.backend.exited

        # All its servers SIGKILLed under load (as an OOM killer would): the requests they held fail
        # before their first byte and re-run on the tandem variant; no client sees an error. Every ext
        # replica dies at once (both ready first): a retry has no other ext replica to go to. Three of
        # the four workers are on non-streaming requests at any moment (each takes 0.4 s), so some are
        # held when the kill comes; a stream cut after its first byte ends with an error event.
        load = Load(gw.url, workers=4, stream=lambda n: n % 4 == 0, max_tokens=40)
        try:
            gw.wait_ready("ext", count=2, timeout=60)  # the load scales it to its maximum
            wait_for(lambda: load.outcomes.ok >= 8, 60, "the load to get going")
            on_cpu = metric(gw.metrics(), "tandem:gateway_requests_total", variant="cpu", code="200")
            victims = [r.replica_id for r in gw.backend.list() if r.variant == "ext"]
            assert len(victims) == 2 and all(r.state == "ready" for r in gw.backend.list() if r.variant == "ext")
            for victim in victims:
                os.kill(engine_pid(gw.backend.pid(victim)), signal.SIGKILL)
            served = load.outcomes.ok
            wait_for(lambda: load.outcomes.ok >= served + 12, 60, "requests after the kill to succeed")
            gw.wait_ready("ext", timeout=60)  # the controller replaced it
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [], outcomes.failures
        assert all("replica_" in detail for detail in outcomes.broken_mid_stream), outcomes.broken_mid_stream
        text = gw.metrics()
        assert metric(text, "tandem:gateway_requests_total", variant="ext", code="200") > 0
        killed = {r.replica_id for r in gw.backend.exited if r.exit_code == -signal.SIGKILL}
        assert set(victims) <= killed  # the tether reports the server's own end
        # The primary gone, the fallback variant served the attempts the kill cut before their first byte.
        assert metric(text, "tandem:gateway_requests_total", variant="cpu", code="200") > on_cpu
        assert gw.errors() == 0
    finally:
        gw.stop()


@pytest.mark.slow
def test_a_fleet_secret_a_command_template_puts_on_the_command_line_is_in_no_log_line(tmp_path):
    """An operator wrote `--api-key {api_key}` in the command (not in env, as the docs advise): the
    secret is in the server's argv, so in the "started replica" line and in whatever the server prints;
    the gateway process logs none of it. A real gateway process, its log read whole."""
    ext = external(lo=1, hi=1)
    ext["command"] = [*ext["command"], "--api-key", "{api_key}"]
    ext.pop("env")
    deployment = tmp_path / "deployment.json"
    deployment.write_text(json.dumps({"variants": [ext], "policy": {"name": "hpa", "interval_s": 0.5}}))
    gateway = ServerProcess(
        ["--deployment", str(deployment), "--served-model-name", MODEL_NAME, "--log-dir", str(tmp_path / "logs"),
         "--log-level", "debug"],
        tmp_path / "gateway.log",
    )  # fmt: skip
    try:
        gateway.wait_ready(timeout=90)
        answer = completion(gateway.url)
        assert answer.status_code == 200, answer.text  # the gateway sent the secret the server demands
        (tether,) = _children(gateway.proc.pid)
        server = Path(f"/proc/{engine_pid(tether)}")
        argv = _argv(server)
        assert argv[1] == FAKE
        secret = argv[argv.index("--api-key") + 1]
        assert len(secret) >= 32
        os.kill(int(server.name), signal.SIGKILL)  # its death is logged with the end of its output
        wait_for(lambda: "exited unexpectedly" in gateway.log(), 30, "the gateway to log the server's exit")
    finally:
        gateway.stop()
    log = gateway.log()
    assert "started replica ext-1" in log and "--api-key [redacted]" in log
    assert secret not in log


def _children(pid: int) -> list[int]:
    """The processes `pid` started, from any of its threads (the controller starts replicas off the loop)."""
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def _argv(proc: Path) -> list[str]:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []
