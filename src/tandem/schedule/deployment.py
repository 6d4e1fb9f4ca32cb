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
and `metrics` adapter): see tandem.schedule.engine_spec. On Ray a variant may also say what each
replica reserves on its node:
`resources: {memory: 2GiB, accelerators: 1, accelerator_type: A100}` (memory default: from its Profile).

pydantic validates at this edge only; a bad file raises DeploymentError naming the file, the field
(`variants[1].replicas.max`) and what is wrong, and for an unknown field the closest known one
("variants[0].replcas: unknown field (did you mean replicas?)"). Inside, everything is frozen
dataclasses. `deployment_schema()` is the file's JSON Schema (`tandem serve --print-deployment-schema`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from tandem.cluster.names import bounded_name
from tandem.contracts import Profile
from tandem.edge.files import ConfigError, describe_errors, load_mapping, unknown_key
from tandem.gate.config import GateConfig, GateSettings
from tandem.schedule.breaker import BreakerConfig
from tandem.schedule.controller import ControllerConfig, Pool
from tandem.schedule.engine_spec import EngineFields, default_served_name, external_engine
from tandem.schedule.fallback import FallbackPlan
from tandem.schedule.policies import POLICIES, Policy, ScaleLimits
from tandem.schedule.routers import Router, make_router
from tandem.schedule.variant import Variant

__all__ = [
    "BackendPlan",
    "Deployment",
    "DeploymentError",
    "VariantPlan",
    "apply_flags",
    "deployment_schema",
    "load_deployment",
    "parse_bytes",
    "parse_deployment",
]


class DeploymentError(ConfigError):
    """The deployment file is unusable; the message names the file, the field and the problem."""


# --- the file's shape (pydantic, this edge only) ----------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_MAX_REPLICAS = 4


class _Replicas(_Strict):
    min: int = Field(1, ge=0)
    max: int = Field(DEFAULT_MAX_REPLICAS, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> _Replicas:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30,
          "ti": 1 << 40, "tib": 1 << 40}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: int | str) -> int:
    """A size in bytes: 1073741824, "1GiB", "1Gi", "512MiB", "1.5GB" (ValueError naming the problem)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 2GiB, 512MiB or 1073741824")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise ValueError("expected a size such as 2GiB, 512MiB or 1073741824")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size < 0:
        raise ValueError("a size must be >= 0")
    return size


class _Resources(_Strict):
    memory: StrictInt | StrictStr | None = Field(
        None, description="Memory each replica reserves on its node: bytes, or 2GiB, 512MiB (default: from the "
        "Profile: weights + KV budget + runtime; none without a Profile).",
    )  # fmt: skip
    accelerators: float = Field(0.0, ge=0, description="Accelerators (GPUs) per replica.")
    accelerator_type: str | None = Field(None, min_length=1, description="Kind of accelerator, e.g. A100.")

    @field_validator("memory")
    @classmethod
    def _size(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            parse_bytes(value)
        return value


class _Variant(EngineFields):  # engine, command, ready_path, metrics, env: tandem.schedule.engine_spec
    name: str = Field(
        min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="How routing and metrics call it."
    )
    recipe: str | None = Field(
        None, min_length=1, description="Optimizer recipe, as text the replica validates (omit: its default)."
    )
    profile: str | dict[str, Any] | None = Field(
        None, description="Measured Profile: a JSON file (relative to this file) or inline; capacity needs it."
    )
    model: str | None = Field(None, description="HF model directory (default: the file's model).")
    threads: int | None = Field(None, ge=1, description="torch threads per replica.")
    regions: list[str] | None = Field(None, min_length=1)
    replicas: _Replicas = _Replicas()
    args: list[str] = Field([], description="More `tandem serve` flags for each replica, verbatim.")
    resources: _Resources = Field(_Resources(), description="What each replica reserves on its node (Ray).")
    usd_per_hour: float | None = Field(
        None, gt=0, description="Price of one replica-hour, for the gate's unit cost (default: tandem's pinned price)."
    )


class _Policy(_Strict):
    name: Literal["hpa", "kpa", "capacity"] = "capacity"
    interval_s: float = Field(1.0, gt=0, description="Seconds between controller ticks.")
    params: dict[str, Any] = Field({}, description="The policy's parameters (HpaParams, KpaParams, CapacityParams).")
    limits: dict[str, Any] = Field({}, description="ScaleLimits: rates, steps and cooldowns.")


class _Router(_Strict):
    name: Literal["least-outstanding", "power-of-two", "region-aware", "prefix-affinity"] = "least-outstanding"
    params: dict[str, Any] = {}


class _Backend(_Strict):
    name: Literal["local", "ray"] = Field("local", description="local: processes on this machine; ray: a Ray cluster.")
    address: str | None = Field(
        None, min_length=1, description="Ray: the cluster's address (HOST:6379, or auto). Default: RAY_ADDRESS, "
        "else the cluster `ray start` left on this machine, else a new local one.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _address_for_ray(self) -> _Backend:
        if self.address is not None and self.name != "ray":
            raise ValueError("an address is for the ray backend (name: ray)")
        if self.address is not None and self.address.startswith("ray://"):
            raise ValueError(
                "Ray Client addresses (ray://) are not supported: run the gateway on a machine of the cluster "
                "and give the cluster's address (HOST:6379)"
            )
        return self


class _Retries(_Strict):
    max_attempts: int = Field(3, ge=1)


class _File(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, title="tandem deployment file")

    model: str | None = Field(None, description="Every variant's model directory (omit: the bundled model).")
    threads: int | None = Field(None, ge=1, description="torch threads per replica.")
    regions: list[str] = Field(["local"], min_length=1)
    primary: str | None = Field(None, description="The variant that serves by default (default: the first).")
    fallback: str | None = Field(None, description="The variant that re-runs requests failed before the first byte.")
    variants: list[_Variant] = Field(min_length=1)
    policy: _Policy = _Policy()
    router: _Router = _Router()
    breaker: dict[str, Any] = Field({}, description="BreakerConfig fields.")
    retries: _Retries = _Retries()
    controller: dict[str, Any] = Field({}, description="ControllerConfig fields (timeouts, restart backoff).")
    backend: _Backend = Field(_Backend(), description="Where replicas run.")
    gate: GateSettings | None = Field(None, description="Shadow traffic to a candidate variant, and its gate.")


def deployment_schema() -> dict[str, Any]:
    """The deployment file's JSON Schema (for editors and CI checks of deployment files)."""
    return _File.model_json_schema()


# --- what the rest of tandem uses (dataclasses) -------------------------------------------------
@dataclass(frozen=True)
class VariantPlan:
    variant: Variant
    limits: ScaleLimits
    regions: tuple[str, ...]


@dataclass(frozen=True)
class BackendPlan:
    """Where the replicas run: `local` processes, or a `ray` cluster (at `address`; None: as ray.init finds one)."""

    name: str = "local"
    address: str | None = None


@dataclass(frozen=True)
class Deployment:
    plans: tuple[VariantPlan, ...]
    primary: str
    fallback: str | None
    policy_name: str
    policy_params: Any
    interval_s: float
    router_name: str
    router_params: Mapping[str, Any]
    breaker: BreakerConfig
    controller: ControllerConfig
    max_attempts: int
    backend: BackendPlan = BackendPlan()
    gate: GateConfig | None = None  # a candidate on shadow traffic, judged by tandem.gate

    @property
    def variants(self) -> dict[str, Variant]:
        return {plan.variant.name: plan.variant for plan in self.plans}

    def policy(self) -> Policy:
        function, _ = POLICIES[self.policy_name]
        return functools.partial(function, params=self.policy_params)

    def pools(self) -> list[Pool]:
        """One pool per variant, the primary first (what `Controller` takes)."""
        ordered = sorted(self.plans, key=lambda plan: plan.variant.name != self.primary)
        return [Pool(p.variant, self.policy_name, self.policy(), p.limits, p.regions) for p in ordered]

    def fallback_plan(self) -> FallbackPlan:
        return FallbackPlan(primary=self.primary, fallback=self.fallback, max_attempts=self.max_attempts)

    def router(self, rng: random.Random | None = None) -> Router:
        return make_router(self.router_name, rng, **self.router_params)


# --- parsing -------------------------------------------------------------------------------------
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
        spec = _File.model_validate(raw)
    except ValidationError as exc:
        raise DeploymentError("; ".join(describe_errors(exc, _File))) from None
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


def _check_gate(spec: _File, names: list[str], primary: str) -> None:
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


VARIANT_NAME_CHARS = 64  # a name from a longer recipe ends in a hash of it (tandem.cluster.names)


def variant_name(recipe: str | None) -> str:
    """A variant's name from its recipe ("int8+ngram" -> "int8-ngram"); "default" for the default recipe.

    At most VARIANT_NAME_CHARS: a longer one (a draft model's path in it) is its start plus a short
    hash of the recipe, so replica ids and log file names made from it stay short."""
    if recipe is None:
        return "default"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", recipe).strip("-") or "primary"
    return bounded_name(name, VARIANT_NAME_CHARS, source=recipe)


def apply_flags(
    raw: Mapping[str, Any] | None,
    *,
    recipe: str | None = None,
    model: str | None = None,
    threads: int | None = None,
    replicas_min: int | None = None,
    replicas_max: int | None = None,
    policy: str | None = None,
    fallback: str | None = None,
    profiles: Mapping[str, Profile] | None = None,
) -> dict[str, Any]:
    """`tandem serve` flags over a deployment file's raw mapping (or over nothing), before validation.

    --recipe names the primary variant (created if the file has none by that recipe);
    --replicas-min/--replicas-max set the primary's replicas; --policy the policy; --fallback a
    variant name or recipe (a variant of that recipe is added if none is called so). `profiles`
    (by variant name) fills in measured Profiles the file does not give.
    """
    out: dict[str, Any] = json.loads(json.dumps(dict(raw or {})))  # a deep copy of plain data
    variants: list[dict[str, Any]] = out.setdefault("variants", [])
    for key, value in (("model", model), ("threads", threads)):
        if value is not None:
            out[key] = value
    if recipe is not None:
        match = next((v for v in variants if v.get("recipe") == recipe), None)
        if match is None:
            match = {"name": variant_name(recipe), "recipe": recipe}
            variants.insert(0, match)
        out["primary"] = match["name"]
    if not variants:
        raise DeploymentError("no variant to serve: pass --recipe or a deployment file with variants")
    primary_name = out.get("primary") or variants[0].get("name")
    primary = next((v for v in variants if v.get("name") == primary_name), variants[0])
    if replicas_min is not None or replicas_max is not None:
        replicas = dict(primary.get("replicas") or {})
        if replicas_min is not None:
            replicas["min"] = replicas_min
        if replicas_max is not None:
            replicas["max"] = replicas_max
        primary["replicas"] = replicas
    if policy is not None:
        out["policy"] = {**(out.get("policy") or {}), "name": policy}
    if fallback is not None:
        match = next((v for v in variants if v.get("name") == fallback), None)
        if match is None:
            match = {"name": variant_name(fallback), "recipe": fallback}
            variants.append(match)
        out["fallback"] = match["name"]
    for variant in variants:
        if variant.get("profile") is None and profiles and variant.get("name") in profiles:
            variant["profile"] = dataclasses.asdict(profiles[variant["name"]])
    return out
