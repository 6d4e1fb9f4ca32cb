"""`tandem serve` in gateway mode: flags and deployment file -> Deployment, and the real process."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from tandem.contracts import Profile
from tandem.schedule.deployment import DeploymentError
from tandem.serve.cli import serve
from tandem.serve.gateway_cli import cached_profile, deployment_from_flags

from .gateway_harness import MODEL_NAME, metric
from .server_process import ServerProcess


def _profile(model, recipe, threads) -> Profile:
    return Profile(recipe, "cpu", str(model), 1000, 64, 8, {1: 50.0, 8: 200.0}, 1000.0, 0.05, 3.0)


def test_flags_alone_make_a_deployment_with_a_fallback_and_measured_profiles():
    calls = []

    def profile(model, recipe, threads):
        calls.append((model, recipe, threads))
        return _profile(model, recipe, threads)

    d = deployment_from_flags(
        None, recipe="int8", model="m", threads=1, replicas_min=1, replicas_max=3, policy="capacity",
        fallback="baseline", regions=["eu", "us"], replica_args=["--served-model-name", "tiny"], profile=profile,
    )  # fmt: skip
    assert (d.primary, d.fallback, d.policy_name) == ("int8", "baseline", "capacity")
    primary, fallback = (p for p in d.plans)
    assert (primary.limits.min_replicas, primary.limits.max_replicas) == (1, 3)
    assert primary.regions == ("eu", "us")
    assert primary.variant.extra_args == ("--served-model-name", "tiny") == fallback.variant.extra_args
    assert primary.variant.profile.decode_tokens_per_s == {1: 50.0, 8: 200.0}
    assert sorted(calls) == [("m", "baseline", 1), ("m", "int8", 1)]


def test_replicas_share_the_cores_by_default(monkeypatch):
    """Without --threads, each replica gets the cores divided by the most replicas that can run."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    d = deployment_from_flags(None, recipe="int8", replicas_min=1, replicas_max=3, policy="hpa", fallback="baseline")
    # int8 up to 3 replicas and the baseline fallback up to 1 (its default): 8 cores // 4
    assert {p.variant.threads for p in d.plans} == {8 // sum(p.limits.max_replicas for p in d.plans)}
    pinned = deployment_from_flags(None, recipe="int8", threads=3, replicas_max=3, policy="hpa")
    assert {p.variant.threads for p in pinned.plans} == {3}


def test_a_deployment_file_with_flags_over_it(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "model: m\nfallback: slow\npolicy: {name: hpa, interval_s: 0.5}\n"
        "variants:\n  - {name: fast, recipe: int8, replicas: {min: 1, max: 2}}\n  - {name: slow, recipe: baseline}\n"
        "breaker: {open_s: 3}\n"
    )
    d = deployment_from_flags(path, replicas_max=5, profile=_profile)
    assert d.primary == "fast" and d.fallback == "slow" and d.interval_s == 0.5 and d.breaker.open_s == 3
    assert d.plans[0].limits.max_replicas == 5 and d.plans[1].limits.max_replicas == 4
    path.write_text("variants:\n  - {name: fast, recipe: int8, replicas: {min: 3, max: 2}}\npolicy: {name: hpa}\n")
    with pytest.raises(DeploymentError, match=r"deploy.yaml: variants\[0\].replicas"):
        deployment_from_flags(path, profile=_profile)


def test_profiles_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    profile = _profile("m", "int8", 1)
    import tandem.optimize.profile as measuring

    monkeypatch.setattr(measuring, "measure_profile", lambda model, recipe, threads=None: profile)
    assert cached_profile("m", "int8", 1) == profile
    monkeypatch.setattr(measuring, "measure_profile", lambda *a, **k: pytest.fail("measured twice"))
    assert cached_profile("m", "int8", 1) == profile
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 1


def test_a_bad_deployment_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("variants: [{name: a, recipe: int8}]\nrouter: {name: nope}\n")
    result = CliRunner().invoke(serve, ["--deployment", str(path), "--policy", "hpa"])
    assert result.exit_code == 1 and "router.name" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(serve, ["--replicas-max", "2", "--policy", "hpa", "--recipe", "no-such-recipe"])
    assert result.exit_code == 1 and "no-such-recipe" in result.output


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_tandem_serve_in_gateway_mode_serves_the_same_api_and_stops_its_replicas(serve_model_dir, tmp_path):
    args = ["--model", str(serve_model_dir), "--served-model-name", MODEL_NAME, "--threads", "1"]
    args += ["--recipe", "int8", "--replicas-min", "1", "--replicas-max", "2", "--policy", "hpa"]
    args += ["--fallback", "baseline", "--log-level", "warning"]
    gateway = ServerProcess(args, tmp_path / "gateway.log")
    try:
        gateway.wait_ready(timeout=120)
        body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 6}
        r = httpx.post(gateway.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == MODEL_NAME and r.json()["usage"]["completion_tokens"] >= 1
        with httpx.stream("POST", gateway.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
            assert s.status_code == 200
            text = "".join(s.iter_text())
        assert text.rstrip().endswith("data: [DONE]")
        chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert httpx.post(gateway.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 200
        bad = httpx.post(gateway.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": 5}, timeout=60)
        assert bad.status_code == 400 and "error" in bad.json()  # the replica's own client error, passed through
        text = httpx.get(gateway.url + "/metrics", timeout=10).text
        assert metric(text, "tandem:replicas", variant="int8", state="ready") == 1
        assert metric(text, "tandem:breaker_state", variant="int8") == 0
        assert len(_processes_mentioning(str(serve_model_dir) + "\0--threads")) >= 2  # its 2 replicas
    finally:
        code = gateway.stop()
    assert code == 0, gateway.log()
    assert _processes_mentioning(str(serve_model_dir) + "\0--threads") == [], "replicas outlived the gateway"
