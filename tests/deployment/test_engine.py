"""A variant's engine in the deployment file: `engine: external` becomes an ExternalEngine; errors name fields."""

from __future__ import annotations

import pytest

from tandem.cluster.external import ExternalEngine
from tandem.deployment import DeploymentError, deployment_schema, parse_deployment

SERVED = ["--served-model-name", "{served_model_name}"]
VLLM = ["vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}", *SERVED]


def deployment(**external):
    return {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "policy": {"name": "hpa"},
        "variants": [
            {"name": "vllm-fp8", "engine": "external", "command": VLLM, **external},
            {"name": "cpu", "recipe": "int8"},
        ],
        "fallback": "cpu",
    }


def test_an_external_variant_becomes_an_engine_on_its_variant_and_replica_spec():
    raw = deployment(ready_path="/health", metrics={"adapter": "vllm"}, env={"VLLM_API_KEY": "{api_key}"})
    raw["variants"][0]["resources"] = {"accelerators": 1}
    dep = parse_deployment(raw, served_model_name="llama")
    gpu, cpu = dep.variants["vllm-fp8"], dep.variants["cpu"]
    assert gpu.engine == ExternalEngine(
        command=tuple(VLLM), ready_path="/health", env=(("VLLM_API_KEY", "{api_key}"),), metrics_adapter="vllm",
        metrics_path="/metrics", served_model_name="llama",
    )  # fmt: skip
    assert gpu.engine.wants_secret and gpu.recipe is None and cpu.engine is None
    spec = gpu.spec("eu")
    assert spec.engine == gpu.engine and spec.ready_path == "/health" and spec.accelerators == 1
    assert cpu.spec().ready_path == "/ready"


def test_defaults_ready_on_health_load_from_gateway_counts_and_the_models_name():
    dep = parse_deployment(deployment())
    engine = dep.variants["vllm-fp8"].engine
    assert (engine.ready_path, engine.metrics_adapter, engine.metrics_path) == ("/health", "none", "/metrics")
    assert engine.served_model_name == "meta-llama/Llama-3.1-8B-Instruct"  # what tandem replicas answer to


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"command": ["vllm", "--port", "{prot}"]}, r"variants\[0\]\.command: .*unknown placeholder \{prot\}"),
        ({"command": ["vllm", "--port", "{port:d}"]}, r"variants\[0\]\.command: .*write a placeholder as \{name\}"),
        ({"command": ["srv", "{x"]}, r"variants\[0\]\.command"),
        ({"command": []}, r"variants\[0\]\.command"),
        ({"command": None}, r"needs its command"),
        ({"recipe": "int8"}, r"variants\[0\]\.recipe: a recipe is for tandem replicas"),
        ({"args": ["--max-num-seqs", "4"]}, r"variants\[0\]\.args: .*tandem replicas"),
        ({"metrics": {"adapter": "tgi"}}, r"variants\[0\]\.metrics\.adapter"),
        ({"ready_path": "health"}, r"variants\[0\]\.ready_path"),
        ({"env": {"KEY": "{secret}"}}, r"unknown placeholder \{secret\}"),
    ],
)
def test_a_bad_external_variant_is_refused_naming_the_field(change, message):
    raw = deployment()
    raw["variants"][0].update(change)
    with pytest.raises(DeploymentError, match=message):
        parse_deployment(raw)


def test_external_fields_on_a_tandem_variant_are_refused():
    raw = deployment()
    raw["variants"][1]["command"] = ["x"]
    with pytest.raises(DeploymentError, match=r"variants\[1\].*command is for external engines"):
        parse_deployment(raw)


def test_a_placeholder_without_a_value_is_refused():
    raw = deployment()
    del raw["model"]
    raw["variants"][0]["command"] = ["llama-server", "--threads", "{threads}"]
    with pytest.raises(DeploymentError, match=r"uses \{threads\} but the variant has no threads"):
        parse_deployment(raw)
    raw["variants"][0]["command"] = ["srv", "-m", "{model}"]
    raw["variants"][0]["threads"] = 2
    raw["variants"][1]["model"] = "x"
    with pytest.raises(DeploymentError, match=r"uses \{model\} but the variant has no model"):
        parse_deployment(raw)


def test_the_capacity_policy_asks_an_external_variant_for_its_measured_profile():
    raw = deployment()
    raw["policy"] = {"name": "capacity"}
    with pytest.raises(DeploymentError, match=r"variants\[0\]\.profile: .*tandem profile --endpoint URL"):
        parse_deployment(raw)


def test_the_schema_documents_the_engine_fields():
    variant = deployment_schema()["$defs"]["_Variant"]["properties"]
    assert {"engine", "command", "ready_path", "metrics", "env"} <= set(variant)
    assert "{served_model_name}" in variant["command"]["description"]
