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
from tandem.edge.settings import Settings
from tandem.schedule.deployment import (
    DEFAULT_MAX_REPLICAS,
    Deployment,
    DeploymentError,
    apply_flags,
    parse_deployment,
    read_deployment_file,
)
from tandem.schedule.profiles import cached_profile

__all__ = ["REPLICA_SETTINGS", "deployment_from_settings", "replica_args"]

# Settings that are a replica's business: passed on to every replica's command line when not default.
REPLICA_SETTINGS = (
    "served_model_name", "dtype", "max_model_len", "kv_cache_tokens", "max_num_seqs", "max_prefill_tokens",
    "max_queue", "max_body_bytes", "max_n", "retry_after_s", "shutdown_timeout", "log_level",
)  # fmt: skip

ProfileSource = Callable[[str | None, str | None, int | None], Profile]


def replica_args(settings: Settings) -> list[str]:
    args: list[str] = []
    for name in REPLICA_SETTINGS:
        value = settings.non_default(name)
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    if settings.access_log:
        args.append("--access-log")
    return args


def deployment_from_settings(settings: Settings, profile: ProfileSource = cached_profile) -> Deployment:
    """The deployment `tandem serve` runs in gateway mode.

    Without a file and without --recipe the primary serves the replicas' default recipe. For the
    capacity policy, variants without a profile get one from `profile` (the cache, or a measurement).
    """
    raw: dict[str, Any] | None = None
    base_dir = Path(".")
    file = settings.deployment
    if file is not None:
        raw = read_deployment_file(file)
        base_dir = Path(file).parent
    if settings.recipe is None and not (raw or {}).get("variants"):
        raw = {**(raw or {}), "variants": [{"name": "default"}]}  # the replicas' own default recipe
    out = apply_flags(
        raw, recipe=settings.recipe, model=settings.model, threads=settings.threads,
        replicas_min=settings.replicas_min, replicas_max=settings.replicas_max, policy=settings.policy,
        fallback=settings.fallback,
    )  # fmt: skip
    if settings.regions:
        out["regions"] = list(settings.regions)
    if out.get("threads") is None and not any(v.get("threads") for v in out["variants"]):
        # Replicas share this machine's cores: at full scale-out each gets its share, never more.
        # Oversubscribed OpenMP threads spin against each other (measured: 127 vs 1455 tok/s).
        most = sum(int((v.get("replicas") or {}).get("max", DEFAULT_MAX_REPLICAS)) for v in out["variants"])
        out["threads"] = max(1, (os.cpu_count() or 1) // max(1, most))
    extra = replica_args(settings)
    for variant in out["variants"]:
        if extra:
            variant["args"] = [*(variant.get("args") or []), *extra]
    if (out.get("policy") or {}).get("name", "capacity") == "capacity":
        for variant in out["variants"]:
            if variant.get("profile") is None:
                measured = profile(
                    variant.get("model", out.get("model")),
                    variant.get("recipe"),
                    variant.get("threads", out.get("threads")),
                )
                variant["profile"] = json.loads(measured.to_json())
    try:
        return parse_deployment(out, base_dir)
    except DeploymentError as exc:
        raise DeploymentError(f"{file}: {exc}" if file is not None else str(exc)) from None
