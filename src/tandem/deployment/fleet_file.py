"""A deployment file with many models: `models:` (one entry per model) and `nodes:` (their budget).

```yaml
nodes: {memory: 24GiB}              # what a node offers replicas (local: this machine)
policy: {name: kpa}                 # top-level defaults every model inherits unless it says its own
models:
  - name: tandem-code-target        # what clients send as "model"; listed by /v1/models
    model: bundled:tandem-code-target   # a directory, a Hugging Face id, or bundled:NAME
    primary: fast
    fallback: baseline
    variants: [...]                 # exactly a single-model file's variant entries
    policy: {name: capacity}
    gate: {...}                     # optional, per model
  - name: tandem-code-draft
    model: bundled:tandem-code-draft
    variants: [{name: base, recipe: baseline, replicas: {min: 0, max: 2}}]
```

Each entry is what a single-model file is (its fields, validated by tandem.deployment.parse),
plus `name`; the file's top-level `threads`, `regions`, `policy`, `router`, `breaker`, `retries`
and `controller` are defaults an entry's own replace whole, and `backend` is the file's alone. A
file without `models:` is one model, as before (`nodes:` may be given there too). Tandem replicas
of a model answer to its name (`--served-model-name`), set here. Errors name the field
(`models[1].variants: Field required`, `models[2].name: 'chat' is used twice`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tandem.data.bundled import BUNDLED_MODELS
from tandem.deployment.memory_need import fill_replica_memory
from tandem.deployment.model import Deployment
from tandem.deployment.models import FleetPlan, NodeBudget, ServedModel
from tandem.deployment.parse import DeploymentError, parse_deployment
from tandem.deployment.sizes import parse_bytes
from tandem.edge.files import unknown_key

__all__ = ["MODEL_DEFAULTS", "MODEL_NAME", "parse_fleet", "resolve_bundled", "split_fleet_file"]

# Top-level keys of a `models:` file that every model inherits unless it gives its own.
MODEL_DEFAULTS = ("threads", "regions", "policy", "router", "breaker", "retries", "controller")
_FILE_KEYS = ("models", "nodes", "backend", *MODEL_DEFAULTS)
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")  # "tandem-code-target", "meta-llama/Llama-3.1-8B"
BUNDLED_PREFIX = "bundled:"


def _nodes(raw: Any) -> NodeBudget:
    if raw is None:
        return NodeBudget()
    if not isinstance(raw, Mapping):
        raise DeploymentError("nodes: expected a mapping such as {memory: 24GiB}")
    for key in raw:
        if key != "memory":
            raise DeploymentError(unknown_key(f"nodes.{key}", str(key), ["memory"]))
    if raw.get("memory") is None:
        return NodeBudget()
    try:
        memory = parse_bytes(raw["memory"])
    except ValueError as exc:
        raise DeploymentError(f"nodes.memory: {exc}") from None
    if memory <= 0:
        raise DeploymentError("nodes.memory: a node's budget must be more than 0 bytes")
    return NodeBudget(memory)


def resolve_bundled(model: Any, where: str) -> Any:
    """`bundled:NAME` -> the bundled model's directory (DeploymentError naming `where` if there is none)."""
    if not isinstance(model, str) or not model.startswith(BUNDLED_PREFIX):
        return model
    name = model[len(BUNDLED_PREFIX) :]
    path = BUNDLED_MODELS / name
    if not name or "/" in name or not (path / "config.json").is_file():
        known = sorted(p.name for p in BUNDLED_MODELS.iterdir() if (p / "config.json").is_file())
        raise DeploymentError(f"{where}: no bundled model is called {name!r} (bundled: {', '.join(known)})")
    return str(path)


def _resolve_models(raw: dict[str, Any], where: str) -> None:
    """Every `model:` of one model's mapping (its own and its variants'), bundled names resolved in place."""
    if "model" in raw:
        raw["model"] = resolve_bundled(raw["model"], f"{where}model")
    for i, variant in enumerate(raw.get("variants") or []):
        if isinstance(variant, dict) and "model" in variant:
            variant["model"] = resolve_bundled(variant["model"], f"{where}variants[{i}].model")


def _answer_to(raw: dict[str, Any], name: str, where: str) -> None:
    """Tandem replicas of the model answer to its name (external engines are told it as {served_model_name})."""
    for i, variant in enumerate(raw.get("variants") or []):
        if not isinstance(variant, dict) or variant.get("engine", "tandem") != "tandem":
            continue
        args = [str(a) for a in variant.get("args") or []]
        if any(a == "--served-model-name" or a.startswith("--served-model-name=") for a in args):
            raise DeploymentError(
                f"{where}variants[{i}].args: --served-model-name is the model's name here ({where}name); drop it"
            )
        variant["args"] = [*args, "--served-model-name", name]


def split_fleet_file(raw: Any) -> tuple[list[tuple[str, Any]], NodeBudget]:
    """A deployment file's mapping -> (model name, that model's single-model mapping) pairs, and the
    nodes' budget. A file without `models:` is one model named "" (its mapping minus `nodes:`)."""
    if not isinstance(raw, Mapping):
        return [("", raw)], NodeBudget()  # parse_deployment says what is wrong with it
    nodes = _nodes(raw.get("nodes"))
    if "models" not in raw:
        single = {k: v for k, v in raw.items() if k != "nodes"}
        _resolve_models(single, "")
        return [("", single)], nodes
    for key in raw:
        if key not in _FILE_KEYS:
            if key in ("variants", "primary", "fallback", "gate", "model"):
                raise DeploymentError(f"{key}: a file with models: gives each model its own (models[i].{key})")
            raise DeploymentError(unknown_key(str(key), str(key), list(_FILE_KEYS)))
    entries = raw["models"]
    if not isinstance(entries, list) or not entries:
        raise DeploymentError("models: expected a list of models, each with a name and its variants")
    defaults = {k: raw[k] for k in (*MODEL_DEFAULTS, "backend") if k in raw}
    out: list[tuple[str, Any]] = []
    for i, entry in enumerate(entries):
        where = f"models[{i}]."
        if not isinstance(entry, Mapping):
            raise DeploymentError(f"models[{i}]: expected a mapping with a name and variants")
        name = entry.get("name")
        if not isinstance(name, str) or not MODEL_NAME.match(name):
            raise DeploymentError(
                f"{where}name: expected the name clients send as 'model' (letters, digits, _ . : / -; "
                f"at most 128), got {name!r}"
            )
        if any(name == seen for seen, _ in out):
            raise DeploymentError(f"{where}name: {name!r} is used twice")
        if "backend" in entry:
            raise DeploymentError(f"{where}backend: every model runs on the file's backend (backend: at the top)")
        if "nodes" in entry:
            raise DeploymentError(f"{where}nodes: nodes are the file's (nodes: at the top)")
        if not entry.get("variants"):
            raise DeploymentError(f"{where}variants: a model needs at least one variant (a recipe to serve)")
        model = {**defaults, **{k: v for k, v in entry.items() if k != "name"}}
        model = {k: (list(v) if isinstance(v, list) else v) for k, v in model.items()}
        if isinstance(model.get("variants"), list):
            model["variants"] = [dict(v) if isinstance(v, Mapping) else v for v in model["variants"]]
        _resolve_models(model, where)
        _answer_to(model, name, where)
        out.append((name, model))
    return out, nodes


def model_error(name: str, index: int, exc: DeploymentError) -> DeploymentError:
    """A model's own error, its field named within the file (models[1].variants[0].profile: ...)."""
    return DeploymentError(f"models[{index}].{exc}" if name else str(exc))


def parse_fleet(raw: Any, base_dir: str | Path = ".", served_model_name: str | None = None) -> FleetPlan:
    """Validate a deployment file's mapping (one model, or `models:`) into a FleetPlan."""
    models, nodes = split_fleet_file(raw)
    served: list[ServedModel] = []
    backends = set()
    for index, (name, model) in enumerate(models):
        if isinstance(model, dict):
            fill_replica_memory(model)  # each replica's need, known before it starts
        try:
            deployment: Deployment = parse_deployment(model, base_dir, name or served_model_name)
        except DeploymentError as exc:
            raise model_error(name, index, exc) from None
        backends.add(deployment.backend)
        served.append(ServedModel(name, deployment))
    assert len(backends) == 1  # the file's one backend: no model may give its own
    return FleetPlan(tuple(served), nodes)
