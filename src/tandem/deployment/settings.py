"""The deployment a gateway runs: the deployment file (if any) with the settings over it, validated.

`replica_args(settings)` are the server settings that are each replica's business (engine sizing,
limits, logging), passed on to every replica's command line. Recipes stay text: a replica
validates its own and reports its own errors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem.contracts import Profile
from tandem.deployment.flags import apply_flags, variant_name
from tandem.deployment.fleet_file import split_fleet_file
from tandem.deployment.memory_need import fill_replica_memory
from tandem.deployment.model import Deployment
from tandem.deployment.parse import DeploymentError, parse_deployment, read_deployment_file
from tandem.deployment.schema import DEFAULT_MAX_REPLICAS
from tandem.edge.settings import Settings
from tandem.schedule.variant import replica_memory_bytes

__all__ = ["REPLICA_SETTINGS", "ProfileSource", "deployment_from_raw", "deployment_from_settings", "replica_args"]

# Settings that are a replica's business: passed on to every replica's command line when not default.
REPLICA_SETTINGS = (
    "served_model_name", "dtype", "max_model_len", "kv_cache_tokens", "max_num_seqs", "max_prefill_tokens",
    "max_queue", "max_body_bytes", "max_n", "max_request_share", "retry_after_s", "shutdown_timeout", "log_level",
    "metrics_prefix", "generation_config", "tool_call_parser",
)  # fmt: skip

# Measures (or finds in the cache) a Profile for (model, recipe, threads): the gateway's start-up passes
# tandem.schedule.profiles.cached_profile; the parser itself measures nothing.
ProfileSource = Callable[[str | None, str | None, int | None], Profile]


def _gated(out: dict[str, Any]) -> set[str]:
    """The primary and the candidate when a gate is configured and the policy is not capacity (else none)."""
    gate = out.get("gate")
    if not isinstance(gate, dict) or (out.get("policy") or {}).get("name", "capacity") == "capacity":
        return set()
    variants = out["variants"]
    return {out.get("primary") or variants[0].get("name"), gate.get("candidate")}


def replica_args(settings: Settings) -> list[str]:
    args: list[str] = []
    for name in REPLICA_SETTINGS:
        value = settings.non_default(name)
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    if settings.access_log:
        args.append("--access-log")
    return args


def _backend(raw: Any, settings: Settings) -> dict[str, Any] | None:
    """The file's `backend:` with --backend and --ray-address over it (None: neither is set)."""
    if settings.backend is None and settings.ray_address is None:
        return None
    backend = dict(raw) if isinstance(raw, dict) else {}
    if settings.backend is not None and settings.backend != backend.get("name"):
        backend = {"name": settings.backend}  # another backend: the file's address was for the file's
    if settings.ray_address is not None:
        if settings.backend not in (None, "ray"):
            raise DeploymentError(f"--ray-address is for the ray backend, not --backend {settings.backend}")
        backend = {**backend, "name": "ray", "address": settings.ray_address}
    return backend


def _shadow(out: dict[str, Any], settings: Settings) -> None:
    """--shadow RECIPE [--shadow-fraction F] over the file's `gate:` block: the candidate variant (the
    primary's model and settings, one replica) and the gate that judges it."""
    if settings.shadow is None:
        if settings.shadow_fraction is not None:
            if not isinstance(out.get("gate"), dict):
                raise DeploymentError("--shadow-fraction needs --shadow RECIPE or a gate: block in the deployment file")
            out["gate"] = {**out["gate"], "fraction": settings.shadow_fraction}
        return
    variants = out["variants"]
    primary = out.get("primary") or variants[0]["name"]
    match = next((v for v in variants if v.get("recipe") == settings.shadow and v.get("name") != primary), None)
    if match is None:
        if any(v.get("name") == primary and v.get("recipe") == settings.shadow for v in variants):
            raise DeploymentError(f"--shadow: {settings.shadow!r} is the primary's recipe; shadow another one")
        name, n = variant_name(settings.shadow), 1
        while any(v.get("name") == name for v in variants):
            n += 1
            name = f"{variant_name(settings.shadow)}-{n}"
        match = {"name": name, "recipe": settings.shadow, "replicas": {"min": 1, "max": 1}}
        variants.append(match)
    gate = {**(out.get("gate") or {}), "candidate": match["name"]}
    if settings.shadow_fraction is not None:
        gate["fraction"] = settings.shadow_fraction
    out["gate"] = gate


def deployment_from_settings(settings: Settings, profile: ProfileSource | None = None) -> Deployment:
    """The deployment `tandem serve` runs in gateway mode.

    Without a file and without --recipe the primary serves the replicas' default recipe. For the
    capacity policy, variants without a profile get one from `profile` (the gateway passes the cache,
    which measures on a miss); without one they keep none, and the capacity policy refuses them.
    """
    raw: dict[str, Any] | None = None
    base_dir = Path(".")
    file = settings.deployment
    if file is not None:
        raw = read_deployment_file(file)
        base_dir = Path(file).parent
        if "models" in raw:
            raise DeploymentError(f"{file}: serves several models (models:); read it with fleet_from_settings")
        [(_, raw)], _ = split_fleet_file(raw)  # `nodes:` is the fleet's; bundled:NAME models resolved
    return deployment_from_raw(raw, settings, profile, base_dir=base_dir, file=file)


def deployment_from_raw(
    raw: dict[str, Any] | None,
    settings: Settings,
    profile: ProfileSource | None = None,
    *,
    base_dir: Path = Path("."),
    file: str | None = None,
    served_model_name: str | None = None,
) -> Deployment:
    """One model's mapping (a single-model file's, or one entry of `models:`) with the settings over it.

    `served_model_name`: the model's name in a `models:` file (else --served-model-name's)."""
    if settings.recipe is None and not (raw or {}).get("variants"):
        raw = {**(raw or {}), "variants": [{"name": "default"}]}  # the replicas' own default recipe
    out = apply_flags(
        raw, recipe=settings.recipe, model=settings.model, threads=settings.threads,
        replicas_min=settings.replicas_min, replicas_max=settings.replicas_max, policy=settings.policy,
        fallback=settings.fallback,
    )  # fmt: skip
    _shadow(out, settings)
    if settings.regions:
        out["regions"] = list(settings.regions)
    backend = _backend(out.get("backend"), settings)
    if backend is not None:
        out["backend"] = backend
    on_ray = (out.get("backend") or {}).get("name") == "ray"
    if on_ray and out.get("threads") is None:
        out["threads"] = 1  # a replica reserves one CPU of its node, and uses one, unless `threads` says more
    if out.get("threads") is None and not any(v.get("threads") for v in out["variants"]):
        # Replicas share this machine's cores: at full scale-out each gets its share, never more.
        # Oversubscribed OpenMP threads spin against each other (measured: 127 vs 1455 tok/s).
        most = sum(int((v.get("replicas") or {}).get("max", DEFAULT_MAX_REPLICAS)) for v in out["variants"])
        out["threads"] = max(1, (os.cpu_count() or 1) // max(1, most))
    extra = replica_args(settings)
    tandem_variants = [v for v in out["variants"] if v.get("engine", "tandem") == "tandem"]  # not external engines
    for variant in tandem_variants:
        if extra:
            variant["args"] = [*(variant.get("args") or []), *extra]
    # The capacity policy sizes every variant by its Profile; the gate prices its two by theirs. An
    # external variant's Profile is measured running (tandem profile --endpoint) and given in the file.
    gated = _gated(out)
    if profile is not None and (gated or (out.get("policy") or {}).get("name", "capacity") == "capacity"):
        for variant in tandem_variants:
            if variant.get("profile") is None and (not gated or variant.get("name") in gated):
                measured = profile(
                    variant.get("model", out.get("model")),
                    variant.get("recipe"),
                    variant.get("threads", out.get("threads")),
                )
                variant["profile"] = json.loads(measured.to_json())
    kv_tokens = settings.non_default("kv_cache_tokens")
    if on_ray and kv_tokens is not None:  # every replica gets this KV budget: reserve memory for it
        for variant in out["variants"]:
            resources = variant.get("resources") or {}
            if resources.get("memory") is None and isinstance(variant.get("profile"), dict):
                memory = replica_memory_bytes(Profile.from_json(json.dumps(variant["profile"])), kv_tokens)
                variant["resources"] = {**resources, "memory": memory}
    fill_replica_memory(out)  # what the rest still lacks (tandem.deployment.memory_need)
    try:
        return parse_deployment(out, base_dir, served_model_name or settings.served_model_name)
    except DeploymentError as exc:
        raise DeploymentError(f"{file}: {exc}" if file is not None else str(exc)) from None
