"""The fleet a gateway runs: the deployment file (one model, or `models:`) with the settings over it.

A single-model file (or none) is exactly `deployment_from_settings`: one model named "". With
`models:`, the settings that shape one model's variants (--recipe, --replicas-min/max, --policy,
--fallback, --shadow, --model, --served-model-name) are refused, naming the file's field to set
instead; the rest (--backend, --regions, --threads, every replica setting such as
--kv-cache-tokens) apply to every model. Replicas share this machine's cores: without `threads`
each gets its share at every model's full scale-out.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from tandem.deployment.fleet_file import model_error, split_fleet_file
from tandem.deployment.models import FleetPlan, NodeBudget, ServedModel
from tandem.deployment.parse import DeploymentError, read_deployment_file
from tandem.deployment.schema import DEFAULT_MAX_REPLICAS
from tandem.deployment.settings import ProfileSource, deployment_from_raw, deployment_from_settings
from tandem.edge.settings import Settings

__all__ = ["PER_MODEL_SETTINGS", "fleet_from_settings"]

# Settings that shape one model's variants: in a `models:` file, each model says its own.
PER_MODEL_SETTINGS = {
    "recipe": "models[i].variants", "replicas_min": "models[i].variants[j].replicas", "replicas_max":
    "models[i].variants[j].replicas", "policy": "models[i].policy", "fallback": "models[i].fallback",
    "shadow": "models[i].gate", "shadow_fraction": "models[i].gate", "model": "models[i].model",
    "served_model_name": "models[i].name",
}  # fmt: skip


def _most_replicas(models: list[tuple[str, Any]]) -> int:
    return sum(
        int((v.get("replicas") or {}).get("max", DEFAULT_MAX_REPLICAS))
        for _, raw in models
        for v in raw.get("variants") or []
        if isinstance(v, dict)
    )


def fleet_from_settings(settings: Settings, profile: ProfileSource | None = None) -> FleetPlan:
    """Every model `tandem serve` runs in gateway mode, and the nodes' budget (--node-memory-gb over
    the file's `nodes.memory`)."""
    plan = _fleet(settings, profile)
    if settings.node_memory_gb is not None:
        plan = dataclasses.replace(plan, nodes=NodeBudget(int(settings.node_memory_gb * (1 << 30))))
    return plan


def _fleet(settings: Settings, profile: ProfileSource | None) -> FleetPlan:
    file = settings.deployment
    raw = read_deployment_file(file) if file is not None else None
    if raw is None or "models" not in raw:
        _, nodes = split_fleet_file(raw or {})
        try:
            return FleetPlan((ServedModel("", deployment_from_settings(settings, profile)),), nodes)
        except ValueError as exc:
            raise DeploymentError(str(exc)) from None
    try:
        for name, field in PER_MODEL_SETTINGS.items():
            if settings.non_default(name) is not None:
                flag = "--" + name.replace("_", "-")
                raise DeploymentError(f"{flag} is one model's setting; this file serves several (set {field})")
        models, nodes = split_fleet_file(raw)
    except DeploymentError as exc:
        raise DeploymentError(f"{file}: {exc}") from None
    on_ray = (raw.get("backend") or {}).get("name") == "ray" or settings.backend == "ray" or bool(settings.ray_address)
    share = max(1, (os.cpu_count() or 1) // max(1, _most_replicas(models)))
    served = []
    for index, (name, model) in enumerate(models):
        if not on_ray and settings.threads is None and model.get("threads") is None:
            if not any(isinstance(v, dict) and v.get("threads") for v in model.get("variants") or []):
                model = {**model, "threads": share}
        try:
            deployment = deployment_from_raw(
                model, settings, profile, base_dir=Path(file).parent, served_model_name=name
            )
        except DeploymentError as exc:
            raise DeploymentError(f"{file}: {model_error(name, index, exc)}") from None
        served.append(ServedModel(name, deployment))
    return FleetPlan(tuple(served), nodes)
