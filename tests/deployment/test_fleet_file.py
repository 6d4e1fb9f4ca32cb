"""A deployment file with many models (`models:`, `nodes:`) -> a FleetPlan, with the settings over it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tandem.data.bundled import bundled_draft_dir, bundled_model_dir
from tandem.deployment import DeploymentError
from tandem.deployment.fleet_file import parse_fleet
from tandem.deployment.fleet_settings import fleet_from_settings
from tandem.deployment.memory_need import estimated_replica_bytes
from tandem.edge.settings import Settings

TWO = {
    "nodes": {"memory": "24GiB"},
    "policy": {"name": "kpa"},
    "models": [
        {
            "name": "tandem-code-target",
            "model": "bundled:tandem-code-target",
            "primary": "fast",
            "fallback": "baseline",
            "variants": [{"name": "fast", "recipe": "int8"}, {"name": "baseline", "recipe": "baseline"}],
            "policy": {"name": "hpa"},
        },
        {
            "name": "tandem-code-draft",
            "model": "bundled:tandem-code-draft",
            "variants": [{"name": "base", "recipe": "baseline", "replicas": {"min": 0, "max": 2}}],
        },
    ],
}


def test_a_file_with_two_models_is_two_deployments_and_the_nodes_budget():
    plan = parse_fleet(TWO)
    assert plan.routed and plan.names == ("tandem-code-target", "tandem-code-draft")
    assert plan.nodes.memory_bytes == 24 << 30
    target, draft = plan.model("tandem-code-target"), plan.model("tandem-code-draft")
    assert (target.primary, target.fallback, target.policy_name) == ("fast", "baseline", "hpa")
    assert draft.policy_name == "kpa" and draft.plans[0].limits.min_replicas == 0  # the file's default policy
    assert target.variants["fast"].model == str(bundled_model_dir())  # bundled:NAME is the bundled directory
    assert draft.variants["base"].model == str(bundled_draft_dir())
    # Its replicas answer to the model's name.
    assert draft.variants["base"].extra_args[-2:] == ("--served-model-name", "tandem-code-draft")


def test_every_replicas_memory_is_known_before_it_starts():
    plan = parse_fleet(TWO)
    target = plan.model("tandem-code-target").variants
    draft = plan.model("tandem-code-draft").variants["base"]
    assert target["fast"].replica_memory == estimated_replica_bytes(str(bundled_model_dir()), "int8")
    assert target["fast"].spec().memory_bytes < target["baseline"].spec().memory_bytes
    assert 0 < draft.spec().memory_bytes < target["fast"].spec().memory_bytes  # the draft is the smaller model


def test_a_single_model_file_is_one_unnamed_model_and_may_give_nodes():
    plan = parse_fleet({"nodes": {"memory": "2GiB"}, "variants": [{"name": "a", "recipe": "baseline"}],
                        "policy": {"name": "hpa"}})  # fmt: skip
    assert not plan.routed and plan.names == ("",) and plan.nodes.memory_bytes == 2 << 30
    assert plan.models[0].deployment.variants["a"].extra_args == ()  # nothing added: no name to answer to


def _with(change) -> dict:
    raw = yaml.safe_load(yaml.safe_dump(TWO))
    change(raw)
    return raw


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["models"][1].update(name="tandem-code-target"), "models[1].name: 'tandem-code-target' is used"),
        (lambda r: r["models"][1].pop("variants"), "models[1].variants: a model needs at least one variant"),
        (lambda r: r["models"][1].update(variants=[]), "models[1].variants: a model needs at least one variant"),
        (lambda r: r["models"][0].pop("name"), "models[0].name: expected the name clients send"),
        (lambda r: r["models"][0].update(backend={"name": "ray"}), "models[0].backend: every model runs on the file"),
        (lambda r: r["models"][1].update(model="bundled:nope"), "models[1].model: no bundled model is called 'nope'"),
        (lambda r: r["models"][1]["variants"][0].update(replcas={}), "models[1].variants[0].replcas: unknown field"),
        (lambda r: r["models"][0].update(fallback="nope"), "models[0].fallback: no variant is called 'nope'"),
        (lambda r: r["models"][1].update(policy={"name": "hpa"}), "models[1].variants[0].replicas.min: only the kpa"),
        (lambda r: r.update(variants=[]), "variants: a file with models: gives each model its own"),
        (lambda r: r.update(nodes={"memory": "lots"}), "nodes.memory: expected a size"),
        (lambda r: r.update(nodes={"memroy": "1GiB"}), "nodes.memroy: unknown field (did you mean memory?)"),
        (lambda r: r.update(models=[]), "models: expected a list of models"),
        (lambda r: r["models"][0]["variants"][0].update(args=["--served-model-name", "x"]),
         "models[0].variants[0].args: --served-model-name is the model's name here"),
    ],
)  # fmt: skip
def test_a_bad_fleet_file_names_the_field(change, message):
    with pytest.raises(DeploymentError) as caught:
        parse_fleet(_with(change))
    assert message in str(caught.value)


def _file(tmp_path: Path, raw: dict) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_settings_over_a_fleet_file_apply_to_every_model(tmp_path):
    settings = Settings(deployment=_file(tmp_path, TWO), max_num_seqs=8, regions=["eu"])
    plan = fleet_from_settings(settings)
    for served in plan.models:
        for variant in served.deployment.variants.values():
            assert "--max-num-seqs" in variant.extra_args and "--served-model-name" in variant.extra_args
            assert variant.threads is not None and variant.replica_memory > 0
        assert all(p.regions == ("eu",) for p in served.deployment.plans)


@pytest.mark.parametrize(
    ("settings", "field"),
    [({"recipe": "int8"}, "models[i].variants"), ({"policy": "hpa"}, "models[i].policy"),
     ({"served_model_name": "x"}, "models[i].name"), ({"shadow": "int8"}, "models[i].gate")],
)  # fmt: skip
def test_one_models_flags_are_refused_over_a_fleet_file(tmp_path, settings, field):
    with pytest.raises(DeploymentError) as caught:
        fleet_from_settings(Settings(deployment=_file(tmp_path, TWO), **settings))
    assert field in str(caught.value) and "fleet.yaml" in str(caught.value)


def test_a_models_error_from_the_settings_path_names_the_file_and_the_model(tmp_path):
    raw = _with(lambda r: r["models"][1]["variants"][0].update(replicas={"min": 3, "max": 1}))
    with pytest.raises(DeploymentError) as caught:
        fleet_from_settings(Settings(deployment=_file(tmp_path, raw)))
    assert "fleet.yaml: models[1].variants[0].replicas" in str(caught.value)


def test_a_single_model_file_through_the_settings_is_what_it_was(tmp_path):
    from tandem.deployment import deployment_from_settings

    raw = {"nodes": {"memory": "2GiB"}, "variants": [{"name": "a", "recipe": "baseline"}], "policy": {"name": "hpa"}}
    settings = Settings(deployment=_file(tmp_path, raw))
    plan = fleet_from_settings(settings)
    assert not plan.routed and plan.nodes.memory_bytes == 2 << 30
    assert plan.models[0].deployment == deployment_from_settings(settings)


def test_node_memory_gb_is_the_budget_over_the_files(tmp_path):
    plan = fleet_from_settings(Settings(deployment=_file(tmp_path, TWO), node_memory_gb=1.5))
    assert plan.nodes.memory_bytes == 3 << 29 and plan.routed
    single = fleet_from_settings(Settings(recipe="baseline", policy="hpa", node_memory_gb=2))
    assert single.nodes.memory_bytes == 2 << 30 and not single.routed
