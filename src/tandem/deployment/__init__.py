"""tandem.deployment: the deployment file and `tandem serve`'s flags -> frozen objects. Torch-free.

It sits above the scheduling layer, the gate and the cluster backends: it validates what an operator
wrote (YAML, TANDEM_* variables, flags) and hands them frozen dataclasses (a Variant per variant,
ScaleLimits, BreakerConfig, ControllerConfig, GateConfig, BackendPlan). None of them imports it.

- parse: a deployment file's mapping -> `Deployment` (`parse_deployment`, `load_deployment`), `DeploymentError`
- schema: the file's shape (pydantic, this edge only) and its JSON Schema; sizes: "2GiB" -> bytes
- model: `Deployment`, `VariantPlan`, `BackendPlan` (what the gateway and the controller read)
- engine: a variant's engine, tandem's own or an external server (`engine: external`)
- flags: `tandem serve` flags over a file's mapping, before validation
- settings: `Settings` -> the `Deployment` a gateway runs, and each replica's share of the settings

Profiles are not measured here: the gateway's start-up passes `deployment_from_settings` the
function that finds or measures them (tandem.schedule.profiles.cached_profile).
"""

from tandem.deployment.flags import apply_flags, variant_name
from tandem.deployment.model import BackendPlan, Deployment, VariantPlan
from tandem.deployment.parse import DeploymentError, load_deployment, parse_deployment, read_deployment_file
from tandem.deployment.schema import DEFAULT_MAX_REPLICAS, deployment_schema
from tandem.deployment.settings import REPLICA_SETTINGS, ProfileSource, deployment_from_settings, replica_args
from tandem.deployment.sizes import parse_bytes

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "REPLICA_SETTINGS",
    "BackendPlan",
    "Deployment",
    "DeploymentError",
    "ProfileSource",
    "VariantPlan",
    "apply_flags",
    "deployment_from_settings",
    "deployment_schema",
    "load_deployment",
    "parse_bytes",
    "parse_deployment",
    "read_deployment_file",
    "replica_args",
    "variant_name",
]
