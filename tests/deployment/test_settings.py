"""Settings (flags, file, TANDEM_*) and a deployment file -> the Deployment a gateway runs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tandem.cli import serve
from tandem.contracts import Profile
from tandem.deployment import DeploymentError, deployment_from_settings, replica_args
from tandem.edge.settings import Settings


def _profile(model, recipe, threads) -> Profile:
    return Profile(
        recipe or "int8+kv-bf16+ngram", "cpu", str(model), 1000, 64, 8, {1: 50.0, 8: 200.0}, 1000.0, 0.05, 3.0
    )


def test_settings_alone_make_a_deployment_with_a_fallback_and_measured_profiles():
    calls = []

    def profile(model, recipe, threads):
        calls.append((model, recipe, threads))
        return _profile(model, recipe, threads)

    settings = Settings(
        recipe="int8", model="m", threads=1, replicas_min=1, replicas_max=3, policy="capacity", fallback="baseline",
        regions=["eu", "us"], served_model_name="tiny", max_num_seqs=8,
    )  # fmt: skip
    d = deployment_from_settings(settings, profile=profile)
    assert (d.primary, d.fallback, d.policy_name) == ("int8", "baseline", "capacity")
    primary, fallback = (p for p in d.plans)
    assert (primary.limits.min_replicas, primary.limits.max_replicas) == (1, 3)
    assert primary.regions == ("eu", "us")
    assert primary.variant.extra_args == ("--served-model-name", "tiny", "--max-num-seqs", "8")
    assert fallback.variant.extra_args == primary.variant.extra_args
    assert primary.variant.profile.decode_tokens_per_s == {1: 50.0, 8: 200.0}
    assert sorted(calls) == [("m", "baseline", 1), ("m", "int8", 1)]


def test_without_a_recipe_the_replicas_serve_their_own_default():
    d = deployment_from_settings(Settings(replicas_max=2, policy="hpa"))
    (plan,) = d.plans
    assert d.primary == "default" and plan.variant.recipe is None and plan.variant.spec().recipe is None


def test_replica_args_carry_the_replicas_settings_only():
    args = replica_args(Settings(max_queue=4, log_level="warning", port=9000, api_key="k", replicas_max=3))
    assert args == ["--max-queue", "4", "--log-level", "warning"]
    args = replica_args(Settings(generation_config="vllm", metrics_prefix="vllm"))
    assert args == ["--metrics-prefix", "vllm", "--generation-config", "vllm"]


def test_replicas_share_the_cores_by_default(monkeypatch):
    """Without --threads, each replica gets the cores divided by the most replicas that can run."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    d = deployment_from_settings(
        Settings(recipe="int8", replicas_min=1, replicas_max=3, policy="hpa", fallback="baseline")
    )
    # int8 up to 3 replicas and the baseline fallback up to 1 (its default): 8 cores // 4
    assert {p.variant.threads for p in d.plans} == {8 // sum(p.limits.max_replicas for p in d.plans)}
    pinned = deployment_from_settings(Settings(recipe="int8", threads=3, replicas_max=3, policy="hpa"))
    assert {p.variant.threads for p in pinned.plans} == {3}


def test_a_deployment_file_with_settings_over_it(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "model: m\nfallback: slow\npolicy: {name: hpa, interval_s: 0.5}\n"
        "variants:\n  - {name: fast, recipe: int8, replicas: {min: 1, max: 2}}\n  - {name: slow, recipe: baseline}\n"
        "breaker: {open_s: 3}\n"
    )
    d = deployment_from_settings(Settings(deployment=str(path), replicas_max=5), profile=_profile)
    assert d.primary == "fast" and d.fallback == "slow" and d.interval_s == 0.5 and d.breaker.open_s == 3
    assert d.plans[0].limits.max_replicas == 5 and d.plans[1].limits.max_replicas == 4
    path.write_text("variants:\n  - {name: fast, recipe: int8, replicas: {min: 3, max: 2}}\npolicy: {name: hpa}\n")
    with pytest.raises(DeploymentError, match=r"deploy.yaml: variants\[0\].replicas"):
        deployment_from_settings(Settings(deployment=str(path)), profile=_profile)
    path.write_text("variants:\n  - {name: fast, recipe: int8, replica: {max: 2}}\npolicy: {name: hpa}\n")
    with pytest.raises(DeploymentError, match=r"variants\[0\].replica: unknown field \(did you mean replicas\?\)"):
        deployment_from_settings(Settings(deployment=str(path)), profile=_profile)


def test_a_bad_deployment_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("variants: [{name: a, recipe: int8}]\nrouter: {name: nope}\n")
    result = CliRunner().invoke(serve, ["--deployment", str(path), "--policy", "hpa"])
    assert result.exit_code == 1 and "router.name" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(serve, ["--deployment", str(tmp_path / "none.yaml")])
    assert result.exit_code == 1 and "cannot read the deployment file" in result.output


def test_backend_and_ray_address_settings_over_the_file(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text("variants: [{name: fast, recipe: int8}]\npolicy: {name: hpa}\nbackend: {name: ray, address: a:1}\n")
    from_file = deployment_from_settings(Settings(deployment=str(path)))
    assert (from_file.backend.name, from_file.backend.address) == ("ray", "a:1")
    assert from_file.plans[0].variant.threads == 1  # on Ray a replica reserves (and uses) one CPU unless told
    assert deployment_from_settings(Settings(deployment=str(path), ray_address="b:2")).backend.address == "b:2"
    local = deployment_from_settings(Settings(deployment=str(path), backend="local"))
    assert (local.backend.name, local.backend.address) == ("local", None)  # the file's address was for Ray
    implied = deployment_from_settings(Settings(recipe="int8", policy="hpa", ray_address="c:3"))
    assert (implied.backend.name, implied.backend.address) == ("ray", "c:3")
    assert deployment_from_settings(Settings(recipe="int8", policy="hpa")).backend.name == "local"
    with pytest.raises(DeploymentError, match="--ray-address is for the ray backend, not --backend local"):
        deployment_from_settings(Settings(recipe="int8", policy="hpa", backend="local", ray_address="c:3"))


def test_on_ray_a_replica_reserves_memory_for_the_kv_budget_every_replica_is_given():
    from tandem.schedule.variant import replica_memory_bytes

    d = deployment_from_settings(Settings(recipe="int8", policy="capacity", backend="ray"), profile=_profile)
    assert d.plans[0].variant.spec().memory_bytes == replica_memory_bytes(_profile("m", "int8", 1))
    small = deployment_from_settings(
        Settings(recipe="int8", policy="capacity", backend="ray", kv_cache_tokens=1024), profile=_profile
    )
    assert small.plans[0].variant.spec().memory_bytes == replica_memory_bytes(_profile("m", "int8", 1), 1024)


def test_shadow_flags_add_the_candidate_variant_and_its_gate():
    """--shadow RECIPE: a one-replica candidate of that recipe and a gate over it; under a policy that
    needs no Profiles, the gate's two variants are still measured (the cost verdict reads them)."""
    calls = []

    def profile(model, recipe, threads):
        calls.append(recipe)
        return _profile(model, recipe, threads)

    settings = Settings(recipe="baseline", policy="hpa", threads=1, shadow="int8+ngram", shadow_fraction=0.5)
    assert settings.gateway_mode
    d = deployment_from_settings(settings, profile=profile)
    candidate = next(p for p in d.plans if p.variant.name == "int8-ngram")
    assert candidate.variant.recipe == "int8+ngram" and candidate.limits.min_replicas == 1
    assert d.gate is not None and d.gate.candidate == "int8-ngram" and d.gate.fraction == 0.5
    assert d.primary == "baseline" and sorted(calls) == ["baseline", "int8+ngram"]


def test_a_gate_block_in_the_file_with_prices_and_bad_shadow_flags(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(
        "variants:\n  - {name: a, recipe: baseline}\n  - {name: b, recipe: int8, usd_per_hour: 0.05}\n"
        "policy: {name: hpa}\ngate: {candidate: b, min_samples: {latency: 10}, auto_promote: false}\n"
    )
    d = deployment_from_settings(Settings(deployment=str(path), shadow_fraction=0.1), profile=_profile)
    assert d.gate.candidate == "b" and d.gate.fraction == 0.1 and d.gate.min_latency_samples == 10
    assert not d.gate.auto_promote and d.variants["b"].usd_per_hour == 0.05 and d.variants["a"].usd_per_hour is None
    with pytest.raises(DeploymentError, match="is the primary's recipe"):
        deployment_from_settings(Settings(recipe="int8", policy="hpa", shadow="int8"), profile=_profile)
    with pytest.raises(DeploymentError, match="--shadow-fraction needs --shadow"):
        deployment_from_settings(Settings(recipe="int8", policy="hpa", shadow_fraction=0.3), profile=_profile)
    result = CliRunner().invoke(serve, ["--recipe", "int8", "--policy", "hpa", "--shadow-fraction", "2"])
    assert result.exit_code == 2 and "--shadow-fraction" in result.output
