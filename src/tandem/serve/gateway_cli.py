"""`tandem serve` in gateway mode: flags and deployment file -> a Deployment -> a running gateway.

Kept apart from the gateway itself (gateway.py: the app, the proxy and its retries), so the request
path reads without the command-line plumbing.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem.schedule.deployment import Deployment
from tandem.serve.gateway import build_gateway, run_gateway

__all__ = ["cached_profile", "deployment_from_flags", "serve_gateway"]

logger = logging.getLogger("tandem.gateway")

# Server flags that are a replica's business: passed on to every replica's command line when given.
_REPLICA_FLAGS = (
    "served_model_name", "dtype", "max_model_len", "kv_cache_tokens", "max_num_seqs", "max_queue",
    "max_body_bytes", "shutdown_timeout",
)  # fmt: skip


def _profile_cache_dir() -> Path:
    import os

    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "profiles"


def cached_profile(model: str | None, recipe: str, threads: int | None):
    """A variant's measured Profile: from the cache, else measured now (minutes on a big model) and cached."""
    import hashlib

    from tandem.contracts import Profile

    key = hashlib.sha256(json.dumps([str(Path(model).resolve()) if model else None, recipe, threads]).encode())
    path = _profile_cache_dir() / f"{key.hexdigest()[:16]}.json"
    if path.is_file():
        return Profile.from_json(path.read_text())
    from tandem.optimize.profile import measure_profile

    logger.info("measuring the profile of %s (%s) for the capacity policy; cached at %s", recipe, model, path)
    profile = measure_profile(model, recipe, threads=threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile.to_json())
    return profile


def deployment_from_flags(
    file: str | Path | None,
    *,
    recipe: str | None = None,
    model: str | None = None,
    threads: int | None = None,
    replicas_min: int | None = None,
    replicas_max: int | None = None,
    policy: str | None = None,
    fallback: str | None = None,
    regions: list[str] | None = None,
    replica_args: list[str] | None = None,
    profile: Callable[[str | None, str, int | None], Any] = cached_profile,
) -> Deployment:
    """The deployment `tandem serve` runs: the file (if any) with the flags over it, validated.

    Without a file and without --recipe the primary is the default recipe. `replica_args` are
    appended to every variant's replica command line (e.g. --served-model-name). For the capacity
    policy, variants without a profile get one from `profile` (the cache, or a measurement).
    """
    import yaml

    from tandem.schedule.deployment import DEFAULT_MAX_REPLICAS, DeploymentError, apply_flags, parse_deployment
    from tandem.serve.served import resolve_recipe

    raw: dict[str, Any] | None = None
    base_dir = Path(".")
    if file is not None:
        path = Path(file)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise DeploymentError(f"{path}: cannot read the deployment file ({exc.strerror or exc})") from None
        except yaml.YAMLError as exc:
            raise DeploymentError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
        if not isinstance(raw, dict):
            raise DeploymentError(f"{path}: the deployment file must be a mapping of fields")
        base_dir = path.parent
    if recipe is None and not (raw or {}).get("variants"):
        recipe = resolve_recipe(None)
    out = apply_flags(
        raw, recipe=recipe, model=model, threads=threads, replicas_min=replicas_min, replicas_max=replicas_max,
        policy=policy, fallback=fallback,
    )  # fmt: skip
    if regions:
        out["regions"] = list(regions)
    if out.get("threads") is None and not any(v.get("threads") for v in out["variants"]):
        # Replicas share this machine's cores: at full scale-out each gets its share, never more.
        # Oversubscribed OpenMP threads spin against each other (measured: 127 vs 1455 tok/s).
        most = sum(int((v.get("replicas") or {}).get("max", DEFAULT_MAX_REPLICAS)) for v in out["variants"])
        out["threads"] = max(1, (os.cpu_count() or 1) // max(1, most))
    for variant in out["variants"]:
        if replica_args:
            variant["args"] = [*(variant.get("args") or []), *replica_args]
    if (out.get("policy") or {}).get("name", "capacity") == "capacity":
        for variant in out["variants"]:
            if variant.get("profile") is None and variant.get("recipe"):
                measured = profile(
                    variant.get("model", out.get("model")),
                    variant["recipe"],
                    variant.get("threads", out.get("threads")),
                )
                variant["profile"] = json.loads(measured.to_json())
    try:
        return parse_deployment(out, base_dir)
    except DeploymentError as exc:
        raise DeploymentError(f"{file}: {exc}" if file is not None else str(exc)) from None


def serve_gateway(config: Any, file: str | None, **flags: Any) -> int:
    """`tandem serve` with gateway flags: build the deployment from the flags and file, then serve."""
    import click

    from tandem.optimize import RecipeError, parse_recipe
    from tandem.schedule.deployment import DeploymentError

    replica_args: list[str] = []
    for name in _REPLICA_FLAGS:
        value = getattr(config, name)
        if value is not None and value != type(config).model_fields[name].default:
            replica_args += [f"--{name.replace('_', '-')}", str(value)]
    regions = [r.strip() for r in flags.pop("regions").split(",") if r.strip()] if flags.get("regions") else None
    flags.pop("regions", None)
    try:
        deployment = deployment_from_flags(
            file, recipe=config.recipe, model=config.model, threads=config.threads, regions=regions,
            replica_args=replica_args, **flags,
        )  # fmt: skip
        for plan in deployment.plans:
            parse_recipe(plan.variant.recipe)
    except (DeploymentError, RecipeError) as exc:
        raise click.ClickException(str(exc)) from None
    gw = build_gateway(deployment)
    return run_gateway(
        gw, config.host, config.port, api_key=config.api_key, log_level=config.log_level, access_log=config.access_log
    )
