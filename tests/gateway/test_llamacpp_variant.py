"""llama.cpp's real OpenAI-compatible server (llama-cpp-python[server], built by `make external`)
serving the bundled model as a GGUF, as replicas of an external variant next to a tandem variant:
routing, scale 1 -> 2 -> 1, fallback to the tandem variant when its server is SIGKILLed (no client
error before the first byte), `tandem profile --endpoint` on it, and the gate judging a switch
from the tandem variant to it. Skips, saying how to build it, where it is not built."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
from llamacpp_server import bundled_gguf, llamacpp_command, require_llamacpp

from tandem.cluster.backend import ReplicaSpec
from tandem.cluster.external import ExternalEngine
from tandem.cluster.local import LocalBackend, popen_spawner
from tandem.contracts import Profile
from tandem.gate.config import GateConfig
from tandem.gate.evidence import Evidence, judge
from tandem.gate.offline import OfflineRun, run_pairs, start_replicas, stop_replicas, workload_bodies
from tandem.gate.sides import Side
from tandem.gate.verdict import Verdict
from tandem.measure.endpoint import measure_endpoint

from .harness import MODEL_NAME, REPLICA_ARGS, Load, RunningGateway, metric, wait_for
from .test_external_variants import beside_a_tandem_fallback, engine_pid

pytestmark = [pytest.mark.external, pytest.mark.slow]


@pytest.fixture(scope="module")
def llama() -> dict:
    """The external variant's deployment entry: llama-cpp-python's server on the bundled model's GGUF."""
    python = require_llamacpp()
    return {
        "name": "llama",
        "engine": "external",
        "model": str(bundled_gguf()),
        # One request at a time, each to the end (the server's default cuts a running one short).
        "command": [*llamacpp_command(python), "--interrupt_requests", "false"],
        "ready_path": "/v1/models",  # llama-cpp-python's server has no /health
        "metrics": {"adapter": "none"},  # ... and no /metrics: the gateway's in-flight counts stand in
    }


def test_llamacpp_replicas_route_scale_fall_back_and_profile(llama, tmp_path):
    raw = beside_a_tandem_fallback({**llama, "replicas": {"min": 1, "max": 2}}, target=1)
    gw = RunningGateway(raw, tmp_path / "logs")
    try:
        gw.wait_ready("llama")
        gw.wait_ready("cpu")
        body = {"model": MODEL_NAME, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
        answer = httpx.post(gw.url + "/v1/completions", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] >= 1, answer.text
        assert metric(gw.metrics(), "tandem:gateway_requests_total", variant="llama", code="200") == 1
        view = httpx.get(gw.url + "/admin/replicas", timeout=10).json()
        (mine,) = [r for r in view["replicas"] if r["variant"] == "llama"]
        assert mine["engine"] == "external" and mine["routing"]["source"] == "gateway-inflight"

        load = Load(gw.url, workers=4, stream=lambda n: n % 2 == 0, max_tokens=16)
        try:
            gw.wait_ready("llama", count=2, timeout=90)  # 1 -> 2
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [] and outcomes.broken_mid_stream == []

        def one_llama() -> bool:
            return sum(1 for r in gw.backend.list() if r.variant == "llama") == 1 and not gw.backend.stopping

        wait_for(one_llama, 90, "the llama variant to shrink back to one replica")  # 2 -> 1

        (replica,) = [r for r in gw.backend.list() if r.variant == "llama"]
        profiled = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "profile", "--endpoint", replica.url, "--concurrency", "1,2",
             "-o", str(tmp_path / "llama.json")], capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert profiled.returncode == 0, profiled.stderr
        profile = Profile.from_json((tmp_path / "llama.json").read_text())
        assert set(profile.decode_tokens_per_s) <= {1, 2} and min(profile.decode_tokens_per_s.values()) > 0
        assert profile.prefill_tokens_per_s > 0 and profile.ttft_s_p50 > 0 and "black-box" in profile.source_note

        on_cpu = metric(gw.metrics(), "tandem:gateway_requests_total", variant="cpu", code="200")
        load = Load(gw.url, workers=3, stream=lambda n: n % 2 == 0, max_tokens=32)
        try:
            wait_for(lambda: load.outcomes.ok >= 3, 90, "the load to get going")
            os.kill(engine_pid(gw.backend.pid(replica.replica_id)), signal.SIGKILL)
            served = load.outcomes.ok
            wait_for(lambda: load.outcomes.ok >= served + 6, 120, "requests after the kill to succeed")
            gw.wait_ready("llama", timeout=90)  # replaced
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [], outcomes.failures
        assert all("replica_" in detail for detail in outcomes.broken_mid_stream), outcomes.broken_mid_stream
        assert metric(gw.metrics(), "tandem:gateway_requests_total", variant="cpu", code="200") > on_cpu
        assert any(r.replica_id == replica.replica_id and r.exit_code == -signal.SIGKILL for r in gw.backend.exited)
        assert gw.errors() == 0
    finally:
        gw.stop()


def test_the_gate_judges_a_switch_from_a_tandem_variant_to_llamacpp(llama, tmp_path):
    """Through the gate's library API with both servers real: the offline runner's replicas are
    tandem recipes, while here the candidate is a command; the pairs, scoring and verdict are the
    gate's own code, unchanged."""
    backend = LocalBackend(spawn=popen_spawner(tmp_path / "logs"), kill_after_s=30.0)
    engine = ExternalEngine(command=tuple(llama["command"]), ready_path="/v1/models", served_model_name=MODEL_NAME)
    specs = [
        ReplicaSpec("tandem", "baseline", threads=1, extra_args=tuple(REPLICA_ARGS)),
        ReplicaSpec("llamacpp", None, model=llama["model"], threads=1, engine=engine),
    ]
    try:
        incumbent, candidate = start_replicas(backend, specs, timeout_s=180)
        profiles = [measure_endpoint(r.url, concurrency=(1, 2), new_tokens=24) for r in (incumbent, candidate)]
        run = OfflineRun(incumbent="baseline", candidate="llamacpp", requests=12, concurrency=2)
        bodies = [{**b, "max_tokens": min(b["max_tokens"], 24)} for b in workload_bodies(run, MODEL_NAME)]

        async def drive():
            async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
                return await run_pairs(bodies, client, incumbent.url, candidate.url, concurrency=2, warmup=2)

        pairs = asyncio.run(drive())
    finally:
        stop_replicas(backend)
    evidence = Evidence(Side("tandem", profiles[0]), Side("llamacpp", profiles[1]), pairs.pairs,
                        pairs.teacher_forcing_off, pairs.mirror)  # fmt: skip
    config = GateConfig(candidate="llamacpp", min_latency_samples=10, min_accuracy_samples=5, min_error_samples=5,
                        bootstrap_resamples=500)  # fmt: skip
    verdict = judge(evidence, config)
    report = json.dumps(verdict.to_dict())
    assert verdict.pairs == 12 and set(verdict.metrics) == {"latency", "accuracy", "cost", "errors"}
    accuracy = verdict.metrics["accuracy"]
    # llama-cpp-python answers an `echo` with max_tokens 0 by generating to its context's end, not by
    # scoring the text: teacher forcing is off, the gate says so and judges the generated tokens.
    assert pairs.teacher_forcing_off and "the server ignored echo" in report, report
    assert any("fallback: agreement on the generations' shared prefix" in r for r in accuracy.reasons), report
    assert accuracy.stats["methods"].get("shared-prefix", 0) >= 5, report
    assert accuracy.stats["exact_match"]["greedy_pairs"] == 12
    assert accuracy.stats["top1_agreement"]["rate"] > 0.5, report  # the same weights: they mostly agree
    assert verdict.metrics["cost"].verdict is not Verdict.INCONCLUSIVE, report  # both Profiles measured
    assert verdict.metrics["errors"].verdict is Verdict.PASS, report
