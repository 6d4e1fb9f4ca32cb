"""The deployment file: a full example round-trips into dataclasses; bad fields get errors naming them."""

from __future__ import annotations

import dataclasses
import json

import pytest
from schedule.helpers import profile

from tandem.cluster.names import short_hash
from tandem.deployment import (
    BackendPlan,
    DeploymentError,
    apply_flags,
    load_deployment,
    parse_bytes,
    parse_deployment,
    variant_name,
)
from tandem.schedule.breaker import BreakerConfig
from tandem.schedule.policies import CapacityParams, HpaParams, KpaParams, ScaleContext, ScaleLimits
from tandem.schedule.routers import PrefixAffinity
from tandem.schedule.variant import replica_memory_bytes

PROFILE = dataclasses.asdict(profile({1: 20.0, 8: 80.0}))

EXAMPLE = """
model: models/tiny
threads: 1
regions: [us, eu]
primary: fast
fallback: baseline
variants:
  - name: fast
    recipe: int8+speculative(k=4)
    profile: fast.json
    replicas: {min: 1, max: 4}
    args: ["--max-num-seqs", "16"]
  - name: baseline
    recipe: baseline
    profile: {PROFILE}
    regions: [us]
    threads: 2
    replicas: {min: 1, max: 2}
policy:
  name: capacity
  interval_s: 0.5
  params: {tpot_slo_s: 0.05, min_tier_tokens_per_s: 10}
  limits: {max_scale_down_rate: 4, scale_up_cooldown_s: 5}
router: {name: prefix-affinity, params: {block_chars: 64}}
breaker: {consecutive_failures: 3, failure_ratio: 0.1, min_calls: 10}
retries: {max_attempts: 2}
controller: {drain_timeout_s: 30}
""".replace("{PROFILE}", json.dumps(PROFILE))


@pytest.fixture
def example(tmp_path):
    (tmp_path / "fast.json").write_text(json.dumps(PROFILE))
    path = tmp_path / "deploy.yaml"
    path.write_text(EXAMPLE)
    return path


def test_a_full_file(example):
    d = load_deployment(example)
    assert (d.primary, d.fallback, d.policy_name, d.interval_s, d.max_attempts) == (
        "fast",
        "baseline",
        "capacity",
        0.5,
        2,
    )
    fast, baseline = d.plans
    assert fast.variant.recipe == "int8+speculative(k=4)" and fast.variant.model == "models/tiny"
    assert fast.variant.threads == 1 and baseline.variant.threads == 2
    assert fast.variant.extra_args == ("--max-num-seqs", "16")
    assert fast.variant.profile.decode_tokens_per_s == {1: 20.0, 8: 80.0}
    assert fast.regions == ("us", "eu") and baseline.regions == ("us",)
    assert fast.limits == ScaleLimits(min_replicas=1, max_replicas=4, max_scale_down_rate=4, scale_up_cooldown_s=5)
    assert baseline.limits.max_replicas == 2
    assert d.policy_params == CapacityParams(tpot_slo_s=0.05, min_tier_tokens_per_s=10)
    assert d.breaker == BreakerConfig(consecutive_failures=3, failure_ratio=0.1, min_calls=10)
    assert d.controller.drain_timeout_s == 30
    assert isinstance(d.router(), PrefixAffinity) and d.router().block_chars == 64
    assert [p.variant.name for p in d.pools()] == ["fast", "baseline"]
    assert d.fallback_plan().fallback == "baseline"
    pool = d.pools()[0]
    desired, _ = pool.policy(ScaleContext(0.0, "fast", 1, 1, (), pool.limits, profile=pool.variant.profile))
    assert desired == 1


def test_minimal_file_defaults():
    d = parse_deployment({"variants": [{"name": "a", "recipe": "baseline"}], "policy": {"name": "hpa"}})
    assert d.primary == "a" and d.fallback is None and d.policy_params == HpaParams()
    assert d.plans[0].regions == ("local",) and d.router_name == "least-outstanding"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "variants: required"),
        ({"variants": []}, "variants: List should have at least 1 item"),
        ({"variants": [{"recipe": "b"}]}, "variants[0].name: required"),
        (
            {"variants": [{"name": "a", "recipe": "b", "replcas": {"max": 2}}]},
            "variants[0].replcas: unknown field (did you mean replicas?)",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b"}], "polcy": {"name": "hpa"}},
            "polcy: unknown field (did you mean policy?)",
        ),
        ({"variants": [{"name": "a", "recipe": "b", "colour": 1}]}, "variants[0].colour: unknown field"),
        ({"variants": [{"name": "a", "recipe": "b", "replicas": {"min": 3, "max": 2}}]}, "variants[0].replicas"),
        ({"variants": [{"name": "a", "recipe": "b", "replicas": {"max": 0}}]}, "variants[0].replicas.max"),
        ({"variants": [{"name": "a b", "recipe": "b"}]}, "variants[0].name"),
        ({"variants": [{"name": "a", "recipe": "b"}] * 2}, "the name 'a' is used twice"),
        ({"variants": [{"name": "a", "recipe": "b"}], "fallback": "z"}, "fallback: no variant is called 'z'"),
        ({"variants": [{"name": "a", "recipe": "b"}], "fallback": "a"}, "fallback: 'a' is the primary"),
        ({"variants": [{"name": "a", "recipe": "b"}], "policy": {"name": "magic"}}, "policy.name: Input should be"),
        ({"variants": [{"name": "a", "recipe": "b"}]}, "variants[0].profile: the capacity policy needs"),
        (
            {"variants": [{"name": "a", "recipe": "b"}], "policy": {"name": "hpa", "params": {"targt": 3}}},
            "policy.params.targt: unknown field (did you mean target?)",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b"}], "policy": {"name": "hpa", "params": {"target": -1}}},
            "policy.params: hpa target must be > 0",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b"}], "policy": {"name": "kpa", "params": {"stable_window_s": "x"}}},
            "policy.params.stable_window_s: Input should be a valid number",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b"}], "policy": {"name": "hpa", "limits": {"min_replicas": 2}}},
            "policy.limits.min_replicas: unknown field",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b"}], "policy": {"name": "hpa"}, "controller": {"start_atempts": 2}},
            "controller.start_atempts: unknown field (did you mean start_attempts?)",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b", "replicas": {"min": 0}}], "policy": {"name": "hpa"}},
            "variants[0].replicas.min: only the kpa policy scales to zero",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b"}], "policy": {"name": "hpa"}, "breaker": {"failure_ratio": 2}},
            "breaker: breaker needs failure_ratio",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b"}], "policy": {"name": "hpa"}, "router": {"params": {"x": 1}}},
            "router.params:",
        ),
        (
            {
                "variants": [{"name": "a", "recipe": "b"}, {"name": "c", "recipe": "d", "replicas": {"min": 0}}],
                "policy": {"name": "kpa"},
                "fallback": "c",
            },
            "variants[1].replicas.min: the fallback must keep a replica warm",
        ),
        (
            {"variants": [{"name": "a", "recipe": "b", "profile": {"recipe": "x"}}]},
            "variants[0].profile: not a valid Profile",
        ),
    ],
)
def test_errors_name_the_field(raw, message):
    with pytest.raises(DeploymentError) as info:
        parse_deployment(raw)
    assert message in str(info.value)


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(DeploymentError, match="cannot read the deployment file"):
        load_deployment(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("variants: [unclosed")
    with pytest.raises(DeploymentError, match=r"bad.yaml: not valid YAML"):
        load_deployment(bad)
    bad.write_text("- a list")
    with pytest.raises(DeploymentError, match="must be a mapping"):
        load_deployment(bad)
    bad.write_text("variants: [{name: a, recipe: b, profile: nowhere.json}]")
    with pytest.raises(DeploymentError, match=r"bad.yaml: variants\[0\].profile: cannot read the profile"):
        load_deployment(bad)


def test_serve_flags_alone_make_a_deployment():
    prof = profile({1: 20.0, 8: 80.0})
    raw = apply_flags(
        None,
        recipe="int8+speculative(k=4)",
        replicas_min=2,
        replicas_max=5,
        policy="capacity",
        fallback="baseline",
        profiles={"int8-speculative-k-4": prof, "baseline": prof},
    )
    d = parse_deployment(raw)
    assert d.primary == "int8-speculative-k-4" and d.fallback == "baseline"
    assert [p.variant.recipe for p in d.plans] == ["int8+speculative(k=4)", "baseline"]
    assert (d.plans[0].limits.min_replicas, d.plans[0].limits.max_replicas) == (2, 5)
    assert d.plans[0].variant.profile == prof


def test_serve_flags_override_a_file():
    raw = {"variants": [{"name": "fast", "recipe": "int8"}, {"name": "base", "recipe": "baseline"}]}
    d = parse_deployment(apply_flags(raw, replicas_max=7, policy="kpa", fallback="base", threads=1))
    assert d.policy_params == KpaParams() and d.fallback == "base" and d.plans[0].limits.max_replicas == 7
    assert d.plans[0].variant.threads == 1
    assert raw["variants"][0] == {"name": "fast", "recipe": "int8"}  # the input is not modified
    with pytest.raises(DeploymentError, match="no variant to serve"):
        apply_flags(None, policy="hpa")


def test_the_backend_and_what_each_replica_reserves_on_its_node():
    d = parse_deployment(
        {
            "variants": [
                {"name": "fast", "recipe": "int8", "resources": {"memory": "1.5GiB", "accelerators": 1,
                                                                  "accelerator_type": "A100"}},
                {"name": "base", "recipe": "baseline", "profile": PROFILE},
                {"name": "bare", "recipe": "bf16"},
            ],
            "policy": {"name": "hpa"},
            "backend": {"name": "ray", "address": "10.0.0.1:6379"},
        }
    )  # fmt: skip
    assert d.backend == BackendPlan("ray", "10.0.0.1:6379")
    fast, base, bare = (p.variant for p in d.plans)
    assert (fast.memory_bytes, fast.accelerators, fast.accelerator_type) == (3 << 29, 1.0, "A100")
    assert fast.spec("eu").memory_bytes == 3 << 29 and fast.spec("eu").accelerators == 1.0
    assert base.memory_bytes is None and base.spec().memory_bytes == replica_memory_bytes(base.profile)
    assert bare.spec().memory_bytes == 0  # no Profile, nothing given: placed by CPUs alone
    assert parse_deployment({"variants": [{"name": "a"}], "policy": {"name": "hpa"}}).backend == BackendPlan()


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ({"name": "kube"}, "backend.name: Input should be 'local' or 'ray'"),
        ({"name": "local", "address": "x:1"}, "backend: an address is for the ray backend"),
        ({"name": "ray", "address": "ray://x:10001"}, "Ray Client addresses (ray://) are not supported"),
        ({"name": "ray", "adress": "x:1"}, "backend.adress: unknown field (did you mean address?)"),
    ],
)
def test_bad_backends_name_the_problem(backend, message):
    with pytest.raises(DeploymentError) as info:
        parse_deployment({"variants": [{"name": "a"}], "policy": {"name": "hpa"}, "backend": backend})
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1024, 1024),
        ("1GiB", 1 << 30),
        ("1Gi", 1 << 30),
        ("512MiB", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("2 gib", 2 << 30),
    ],
)
def test_sizes(size, expected):
    assert parse_bytes(size) == expected


@pytest.mark.parametrize("size", ["1.5XB", "GiB", "-1GiB", -5, True])
def test_bad_sizes_are_refused(size):
    with pytest.raises(ValueError, match="size"):
        parse_bytes(size)
    with pytest.raises(DeploymentError, match=r"variants\[0\].resources.memory"):
        parse_deployment({"variants": [{"name": "a", "resources": {"memory": size}}], "policy": {"name": "hpa"}})


def test_the_schema_describes_the_backend_and_the_resources():
    from tandem.deployment import deployment_schema

    schema = deployment_schema()
    assert "backend" in schema["properties"] and "resources" in schema["$defs"]["_Variant"]["properties"]
    assert schema["$defs"]["_Backend"]["properties"]["name"]["enum"] == ["local", "ray"]
    assert set(schema["$defs"]["_Resources"]["properties"]) == {"memory", "accelerators", "accelerator_type"}


def test_a_variant_named_after_a_long_recipe_is_its_start_and_a_hash_of_the_recipe():
    assert variant_name("int8+ngram") == "int8-ngram" and variant_name(None) == "default"
    recipe = "int8+speculative(k=4,draft=/srv/models/" + "a-draft-model-directory/" * 12 + "llama-68m)"
    name = variant_name(recipe)
    assert len(recipe) > 255 and len(name) <= 64
    assert name.startswith("int8-speculative-k-4-draft-srv-models") and name.endswith(short_hash(recipe))
    assert variant_name(recipe.replace("68m", "160m")) != name
