"""The deployment file: which variants run, where, how they scale, route and fail over. YAML in, dataclasses out.

```yaml
model: models/tiny              # default for every variant (omit: the bundled model)
threads: 1                      # torch threads per replica
regions: [local]                # default regions of every variant
primary: fast                   # the variant that serves by default (default: the first)
fallback: baseline              # re-runs requests that failed on another variant before the first byte
variants:
  - name: fast
    recipe: int8+speculative(k=4)
    profile: profiles/fast.json # measured Profile (path relative to this file, or inline); capacity needs it
    replicas: {min: 1, max: 4}
  - name: baseline
    recipe: baseline
    profile: profiles/baseline.json
    replicas: {min: 1, max: 2}
policy: {name: capacity, interval_s: 1.0, params: {tpot_slo_s: 0.1}, limits: {max_scale_down_rate: 2}}
router: {name: prefix-affinity, params: {block_chars: 256}}
breaker: {consecutive_failures: 5, failure_ratio: 0.5, window_s: 30, open_s: 10}
retries: {max_attempts: 3}
controller: {drain_timeout_s: 120, start_timeout_s: 300}
backend: {name: ray, address: auto}  # where replicas run: local processes (default) or a Ray cluster
gate: {candidate: fast, fraction: 0.2}  # shadow traffic to a candidate variant (tandem.gate.config)
```

A variant may give its price, `usd_per_hour: 0.2` per replica-hour (the gate's unit cost; default:
the pinned price in tandem.pricing). The gate's candidate must be another variant than the primary
and the fallback, and keep a replica while it shadows (`replicas.min >= 1`).

A variant may be someone else's server (`engine: external`, a `command` template, its `ready_path`
and `metrics` adapter): see tandem.deployment.engine. On Ray a variant may also say what each
replica reserves on its node:
`resources: {memory: 2GiB, accelerators: 1, accelerator_type: A100}` (memory default: from its Profile).

pydantic validates at this edge only; a bad file raises DeploymentError naming the file, the field
(`variants[1].replicas.max`) and what is wrong, and for an unknown field the closest known one
("variants[0].replcas: unknown field (did you mean replicas?)"). Inside, everything is frozen
dataclasses (tandem.deployment.model); the file's shape and JSON Schema are in tandem.deployment.schema.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from tandem.contracts import Profile
from tandem.deployment.engine import default_served_name, external_engine
from tandem.deployment.model import BackendPlan, Deployment, VariantPlan
from tandem.deployment.schema import DeploymentFile
from tandem.deployment.sizes import parse_bytes
from tandem.edge.files import ConfigError, describe_errors, load_mapping, unknown_key
from tandem.schedule.breaker import BreakerConfig
from tandem.schedule.controller import ControllerConfig
from tandem.schedule.policies import POLICIES, ScaleLimits
from tandem.schedule.routers import make_router
from tandem.schedule.variant import Variant

__all__ = ["DeploymentError", "load_deployment", "parse_deployment", "read_deployment_file"]


class DeploymentError(ConfigError):
    """The deployment file is unusable; the message names the file, the field and the problem."""


def _dataclass(kind: type, raw: Mapping[str, Any], where: str, fixed: Mapping[str, Any] | None = None):
    """Build a frozen dataclass from a mapping: unknown keys and bad values name `where`."""
    known = [f.name for f in dataclasses.fields(kind) if f.name not in (fixed or {})]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise DeploymentError(unknown_key(f"{where}.{unknown[0]}", unknown[0], known))
    try:
        return TypeAdapter(kind).validate_python({**raw, **(fixed or {})})
    except ValidationError as exc:
        raise DeploymentError("; ".join(describe_errors(exc, within=where))) from None


def _profile(raw: str | dict[str, Any] | None, base_dir: Path, where: str) -> Profile | None:
    if raw is None:
        return None
    try:
        if isinstance(raw, dict):
            return Profile.from_json(json.dumps(raw))
        path = Path(raw) if Path(raw).is_absolute() else base_dir / raw
        return Profile.from_json(path.read_text())
    except OSError as exc:
        raise DeploymentError(f"{where}: cannot read the profile ({exc.strerror or exc})") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise DeploymentError(f"{where}: not a valid Profile ({exc})") from None


def parse_deployment(raw: Any, base_dir: str | Path = ".", served_model_name: str | None = None) -> Deployment:
    """Validate a mapping (a parsed deployment file) into a Deployment.

    `served_model_name`: what clients put in "model" (--served-model-name); external engines are told
    it (`{served_model_name}`). Default: the file's model's name, as tandem replicas answer to it."""
    try:
        spec = DeploymentFile.model_validate(raw)
    except ValidationError as exc:
        raise DeploymentError("; ".join(describe_errors(exc, DeploymentFile))) from None
    names = [v.name for v in spec.variants]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DeploymentError(f"variants: the name {duplicates[0]!r} is used twice")
    primary = spec.primary or names[0]
    for field, name in (("primary", primary), ("fallback", spec.fallback)):
        if name is not None and name not in names:
            raise DeploymentError(f"{field}: no variant is called {name!r} (variants: {', '.join(names)})")
    if spec.fallback is not None and spec.fallback == primary:
        raise DeploymentError(f"fallback: {spec.fallback!r} is the primary variant; a fallback must differ")
    if spec.fallback is not None and spec.variants[names.index(spec.fallback)].replicas.min < 1:
        index = names.index(spec.fallback)
        raise DeploymentError(f"variants[{index}].replicas.min: the fallback must keep a replica warm (min >= 1)")

    policy_type = POLICIES[spec.policy.name][1]
    params = _dataclass(policy_type, spec.policy.params, "policy.params")
    plans = []
    for i, v in enumerate(spec.variants):
        where = f"variants[{i}]"
        limits = _dataclass(
            ScaleLimits,
            spec.policy.limits,
            "policy.limits",
            {"min_replicas": v.replicas.min, "max_replicas": v.replicas.max},
        )
        profile = _profile(v.profile, Path(base_dir), f"{where}.profile")
        if spec.policy.name == "capacity" and profile is None:
            how = " (measure it running: `tandem profile --endpoint URL`)" if v.engine == "external" else ""
            raise DeploymentError(f"{where}.profile: the capacity policy needs the variant's measured Profile{how}")
        if spec.policy.name != "kpa" and v.replicas.min == 0:
            raise DeploymentError(f"{where}.replicas.min: only the kpa policy scales to zero; use min >= 1")
        model = v.model if v.model is not None else spec.model
        threads = v.threads if v.threads is not None else spec.threads
        engine = external_engine(
            v, model=model, threads=threads, recipe=v.recipe, args=v.args, where=where, error=DeploymentError,
            served_model_name=served_model_name or default_served_name(spec.model),
        )  # fmt: skip
        variant = Variant(
            name=v.name,
            recipe=v.recipe,
            profile=profile,
            model=model,
            threads=threads,
            extra_args=tuple(v.args),
            memory_bytes=parse_bytes(v.resources.memory) if v.resources.memory is not None else None,
            accelerators=v.resources.accelerators,
            accelerator_type=v.resources.accelerator_type,
            usd_per_hour=v.usd_per_hour,
            engine=engine,
        )
        plans.append(VariantPlan(variant, limits, tuple(v.regions or spec.regions)))

    if spec.gate is not None:
        _check_gate(spec, names, primary)
    router_params = dict(spec.router.params)
    try:
        make_router(spec.router.name, None, **router_params)
    except TypeError as exc:
        raise DeploymentError(f"router.params: {exc}") from None
    return Deployment(
        plans=tuple(plans),
        primary=primary,
        fallback=spec.fallback,
        policy_name=spec.policy.name,
        policy_params=params,
        interval_s=spec.policy.interval_s,
        router_name=spec.router.name,
        router_params=router_params,
        breaker=_dataclass(BreakerConfig, spec.breaker, "breaker"),
        controller=_dataclass(ControllerConfig, spec.controller, "controller"),
        max_attempts=spec.retries.max_attempts,
        backend=BackendPlan(spec.backend.name, spec.backend.address),
        gate=spec.gate.to_config() if spec.gate is not None else None,
    )


def _check_gate(spec: DeploymentFile, names: list[str], primary: str) -> None:
    assert spec.gate is not None
    candidate = spec.gate.candidate
    if candidate not in names:
        raise DeploymentError(f"gate.candidate: no variant is called {candidate!r} (variants: {', '.join(names)})")
    for role, name in (("primary", primary), ("fallback", spec.fallback)):
        if candidate == name:
            raise DeploymentError(f"gate.candidate: {candidate!r} is the {role}; the candidate must be another variant")
    if spec.variants[names.index(candidate)].replicas.min < 1:
        index = names.index(candidate)
        raise DeploymentError(f"variants[{index}].replicas.min: the gate's candidate must keep a replica (min >= 1)")


def read_deployment_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a deployment file (YAML, or JSON by its .json suffix), not validated yet."""
    try:
        return load_mapping(path, "deployment file")
    except ConfigError as exc:
        raise DeploymentError(str(exc)) from None


def load_deployment(path: str | Path) -> Deployment:
    """Read and validate a deployment file (YAML, or JSON by its .json suffix)."""
    raw = read_deployment_file(path)
    try:
        return parse_deployment(raw, Path(path).parent)
    except DeploymentError as exc:
        raise DeploymentError(f"{path}: {exc}") from None
