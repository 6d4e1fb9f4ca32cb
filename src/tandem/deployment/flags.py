"""`tandem serve` flags over a deployment file's raw mapping, before it is validated."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from tandem.cluster.names import bounded_name
from tandem.contracts import Profile
from tandem.deployment.parse import DeploymentError

__all__ = ["apply_flags", "variant_name"]


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
