"""Many models behind one gateway: each model is the Gateway one model was, and requests pick theirs
by the `model` field.

`build_fleet_gateway(plan, backend)`: a single-model plan is exactly `build_gateway`. With
`models:`, every model gets its own Gateway (variants, fallback plan, breakers, policy, router,
controller, in-flight and demand, gate and shadow, rollouts, upstream and its liveness, metrics),
over its own view of the one shared backend (tandem.gateway.model_backend), and its metrics
written to a registry of its own that the gateway's /metrics page labels with `model`
(tandem.gateway.model_metrics). The Gateway returned is the first model's with `models` filled
in (and the gateway's registry), so what reads one model reads the first.

- `route(gw, name)`: the Gateway a request's `model` names: 404 `model_not_found` (naming the
  models served) for any other, 400 when a request to a many-model gateway names none. One model:
  every request is its own, and the replica checks the name as before.
- `for_operator(gw, name)`: the same for the admin API, where `model` is required (400 naming
  the models) once more than one is served.
- `model_cards(gw)`: GET /v1/models of a many-model gateway, each model's variants under `tandem`.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from fastapi import Request
from prometheus_client import CollectorRegistry

from tandem.cluster.backend import Backend, ReplicaState
from tandem.cluster.local import LocalBackend, popen_spawner
from tandem.deployment.models import FleetPlan
from tandem.edge.bodies import parsed_body
from tandem.edge.errors import APIError
from tandem.gateway.model_backend import SharedBackend
from tandem.gateway.model_metrics import ModelLabelled
from tandem.gateway.wiring import Gateway, build_gateway, default_log_dir

__all__ = [
    "all_ready", "build_fleet_gateway", "for_operator", "model_cards", "model_state", "requested_model", "route",
    "warmest",
]  # fmt: skip

_SHOWN_CHARS = 120  # of a client's model name quoted back in an error


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "model"


def build_fleet_gateway(plan: FleetPlan, backend: Backend | None = None, **gateway: Any) -> Gateway:
    """The gateway for every model of `plan`; `gateway`: build_gateway's keyword arguments."""
    if not plan.routed:
        return build_gateway(plan.models[0].deployment, backend, **gateway)
    backend = backend or LocalBackend(spawn=popen_spawner(default_log_dir()))
    shared = SharedBackend(backend)
    registry = gateway.pop("registry", None) or CollectorRegistry(auto_describe=True)
    gate_log_dir = gateway.pop("gate_log_dir", None)
    parts: dict[str, Gateway] = {}
    for served in plan.models:
        part = build_gateway(
            served.deployment, shared.view(served.name), registry=CollectorRegistry(auto_describe=True),
            gate_log_dir=gate_log_dir / _safe(served.name) if gate_log_dir is not None else None, **gateway,
        )  # fmt: skip
        part.model = served.name
        parts[served.name] = part
    registry.register(ModelLabelled({name: part.registry for name, part in parts.items()}))
    first = parts[plan.models[0].name]
    top = dataclasses.replace(first, registry=registry, models=parts)
    parts[first.model] = first
    return top


def _names(gw: Gateway) -> str:
    return ", ".join(repr(name) for name in gw.models)


def route(gw: Gateway, name: Any) -> Gateway:
    """The Gateway that serves requests for model `name` (the request's `model` field)."""
    if not gw.models:
        return gw
    if isinstance(name, str) and name in gw.models:
        return gw.models[name]
    if name is None:
        raise APIError(400, f"name the model to use ('model'); this gateway serves {_names(gw)}", param="model")
    shown = name[:_SHOWN_CHARS] if isinstance(name, str) else name
    raise APIError(
        404, f"the model {shown!r} does not exist; this gateway serves {_names(gw)}", param="model",
        code="model_not_found",
    )  # fmt: skip


def requested_model(request: Request) -> Any:
    """The request's `model` field as the edge parsed the body (None: none, or not a JSON object)."""
    payload = parsed_body(request.scope)
    return payload.get("model") if isinstance(payload, dict) else None


def all_ready(gw: Gateway) -> bool:
    """GET /ready: every model that keeps a replica (its primary's min >= 1) has one ready; a model
    that scales to zero is started by its first request, not waited for."""
    if not gw.models:
        return gw.fleet.ready()
    for part in gw.models.values():
        pool = part.fleet.controller.pools[part.fleet.controller.primary]
        if pool.limits.min_replicas >= 1 and not part.fleet.ready():
            return False
    return True


def warmest(gw: Gateway) -> Gateway:
    """The first model with a ready replica (for routes any replica answers alike: GET /version)."""
    return next((part for part in gw.parts() if part.fleet.ready()), gw)


def for_operator(gw: Gateway, name: str | None) -> Gateway:
    """The model an operator's request is about: required (400) once the gateway serves several."""
    if not gw.models:
        return gw
    if name is None:
        if len(gw.models) == 1:
            return next(iter(gw.models.values()))
        raise APIError(400, f"say which model ('model'): this gateway serves {_names(gw)}", param="model")
    return route(gw, name)


def model_state(part: Gateway) -> str:
    """`serving` (a replica of its primary is ready), `cold` (none live: at zero, or never started),
    `starting`, `failed` (its primary can never start), or `draining`."""
    if part.draining:
        return "draining"
    if part.fleet.fatal is not None or part.fleet.controller.fatal is not None:
        return "failed"
    replicas = part.fleet.backend.list()
    if part.fleet.ready():
        return "serving"
    return "starting" if any(r.live for r in replicas) else "cold"


def model_cards(gw: Gateway, created: int | None = None) -> dict[str, Any]:
    """GET /v1/models: every model served (OpenAI's list), each with its variants under `tandem`."""
    created = int(time.time()) if created is None else created
    data = []
    for name, part in gw.models.items():
        snap = part.fleet.controller.snapshot()
        ready = sum(1 for r in snap.replicas if r.state is ReplicaState.READY)
        variants = [
            {
                "name": v, "recipe": pool.variant.recipe, "primary": v == snap.primary,
                "fallback": v == part.deployment.fallback,
                "replicas": {"min": pool.limits.min_replicas, "max": pool.limits.max_replicas},
            }
            for v, pool in snap.pools.items()
        ]  # fmt: skip
        data.append(
            {
                "id": name, "object": "model", "created": created, "owned_by": "tandem",
                "tandem": {"state": model_state(part), "ready_replicas": ready, "variants": variants},
            }
        )  # fmt: skip
    return {"object": "list", "data": data}
