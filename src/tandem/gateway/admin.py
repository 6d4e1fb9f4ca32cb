"""The operator API: what runs and why (`GET /admin/replicas`), switch the primary traffic to another
recipe or variant (`POST /admin/use`, a `Controller.use()` rollout: zero failed requests) and follow it
(`GET /admin/rollout`), the validation gate's state, numbers and decisions (`GET /admin/gate`) and an
operator's go after a PASS without auto_promote (`POST /admin/gate/promote`). Guarded by the API key
when one is set (tandem.edge.auth).

`POST /admin/use` takes `{"variant": NAME}` (a variant of the deployment, or one served before: a
roll-back) or `{"recipe": R}` (a new variant of the primary's model and settings, named after R),
and answers 202 at once: the rollout starts new replicas, shifts traffic once they are ready, then
drains the old ones. The recipe is not checked here: the new replicas report their own errors, and
a rollout whose replicas fail to start is aborted with that error (`GET /admin/rollout`). Under
the capacity policy a new recipe's Profile is measured first (`preparing`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.deployment import variant_name
from tandem.deployment.memory_need import replica_bytes_from_args
from tandem.edge.bodies import ParsedBodyRoute
from tandem.edge.errors import APIError
from tandem.gateway.models import for_operator
from tandem.gateway.wiring import Gateway, PendingUse
from tandem.schedule.controller import Snapshot
from tandem.schedule.variant import Variant

__all__ = ["UseRequest", "build_admin_router", "replicas_view", "rollout_view", "variant_to_use"]

logger = logging.getLogger("tandem.gateway")


class UseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, min_length=1, description="The model (required when the gateway serves several).")
    variant: str | None = Field(None, min_length=1, description="A variant of the deployment, or one served before.")
    recipe: str | None = Field(None, min_length=1, description="A recipe to serve as a new variant.")
    shift_step: float = Field(1.0, gt=0, le=1, description="Share of traffic moved per controller tick.")
    timeout_s: float = Field(600.0, gt=0, description="Abort if the new replicas are not ready by then.")

    @model_validator(mode="after")
    def _one_of(self) -> UseRequest:
        if (self.variant is None) == (self.recipe is None):
            raise ValueError("give exactly one of 'variant' and 'recipe'")
        return self


def variant_to_use(known: dict[str, Variant], snap: Snapshot, request: UseRequest) -> Variant:
    """The Variant a `POST /admin/use` asks for (APIError 404/409 when there is none to switch to)."""
    primary = snap.pools[snap.primary].variant
    if request.variant is not None:
        name = request.variant
        chosen = snap.pools[name].variant if name in snap.pools else known.get(name)
        if chosen is None:
            raise APIError(
                404, f"no variant is called {name!r} (known: {', '.join(sorted(known))})", param="variant",
                code="variant_not_found",
            )  # fmt: skip
    else:
        chosen = next((v for v in known.values() if v.recipe == request.recipe and v.name != primary.name), None)
        if chosen is None:
            base = variant_name(request.recipe)
            name, n = base, 1
            while name in known or name in snap.pools:
                n += 1
                name = f"{base}-{n}"
            # The primary's model, settings and resources: it reserves what the primary's replicas
            # reserve, unless that was computed from the recipe (tandem.deployment.memory_need), then
            # what the new recipe needs; its Profile is the old recipe's, so not that.
            memory = primary.replica_memory or None
            if memory == replica_bytes_from_args(primary.model, primary.recipe, primary.extra_args):
                memory = replica_bytes_from_args(primary.model, request.recipe, primary.extra_args) or memory
            chosen = dataclasses.replace(primary, name=name, recipe=request.recipe, profile=None, memory_bytes=memory)
    if chosen.name == snap.primary:
        raise APIError(409, f"{chosen.name!r} already serves the primary traffic", code="already_primary")
    return chosen


def every_models_replicas(top: Gateway) -> dict[str, Any]:
    """GET /admin/replicas of a many-model gateway: each model's view, and every replica with its model."""
    views = {name: replicas_view(part, part.fleet.controller.snapshot()) for name, part in top.models.items()}
    flat = [{**r, "model": name} for name, view in views.items() for r in view["replicas"]]
    return {"models": views, "replicas": flat}


def _rollout(snap: Snapshot, now: float) -> dict[str, Any] | None:
    r = snap.rollout
    if r is None:
        return None
    count = lambda variant, *states: sum(1 for x in snap.replicas if x.variant == variant and x.state in states)  # noqa: E731
    return {
        "old": r.old,
        "new": r.new,
        "phase": r.phase.value,
        "weight": r.weight,
        "target": r.target,
        "new_ready": count(r.new, "ready"),
        "new_starting": count(r.new, "starting"),
        "old_left": count(r.old, "starting", "ready", "draining"),
        "elapsed_s": round(now - r.started_at, 3),
        "reason": r.reason or None,
    }


def rollout_view(gw: Gateway, snap: Snapshot) -> dict[str, Any]:
    pending = dataclasses.asdict(gw.fleet.pending) if gw.fleet.pending is not None else None
    return {"primary": snap.primary, "preparing": pending, "rollout": _rollout(snap, gw.clock())}


def replicas_view(gw: Gateway, snap: Snapshot) -> dict[str, Any]:
    now = gw.clock()
    estimates = gw.fleet.inflight.loads(snap.replicas)
    replicas = []
    for r in snap.replicas:
        history = snap.starts.get(r.variant)
        report = gw.fleet.inflight.reports.get(r.replica_id)
        estimate = estimates[r.replica_id]
        replicas.append(
            {
                "id": r.replica_id,
                "variant": r.variant,
                "recipe": r.spec.recipe,
                "region": r.region,
                "state": r.state.value,
                "address": r.url,
                "node": r.node or None,
                "pending": None if r.pending is None else {"cause": r.pending.cause, "detail": r.pending.detail},
                "reason": None if r.pending is None else r.pending.reason,  # why it waits (room, a region)
                "memory_bytes": r.spec.memory_bytes,  # what it reserves on its node (0: nothing)
                "up_s": round(now - r.started_at, 3),
                "load": None if report is None else {
                    "running": report.load.running, "waiting": report.load.waiting, "kv_used": report.load.kv_used,
                    "healthy": report.load.healthy, "age_s": round(now - report.at, 3),
                    "source": report.load.source,
                },
                "routing": {
                    "outstanding": estimate.running + estimate.waiting, "healthy": estimate.healthy,
                    "source": estimate.source,  # whose numbers: tandem's /load, a metrics adapter, or gateway-inflight
                },
                "engine": "external" if r.spec.engine is not None else "tandem",
                "restarts": history.restarts if history else 0,  # of its variant
                "last_error": (history.last_error or None) if history else None,
            }
        )  # fmt: skip
    variants = {
        name: {
            "recipe": pool.variant.recipe,
            "replicas": {"min": pool.limits.min_replicas, "max": pool.limits.max_replicas},
            "restarts": snap.starts[name].restarts if name in snap.starts else 0,
            "failed_starts_in_a_row": snap.starts[name].failures if name in snap.starts else 0,
            "next_start_in_s": max(0.0, round((snap.starts[name].retry_at or now) - now, 3))
            if name in snap.starts
            else 0.0,
            "last_error": (snap.starts[name].last_error or None) if name in snap.starts else None,
            # why it scales or not: the policy's last decision and its inputs (tandem.schedule.scale_decision)
            "scaling": snap.decisions[name].view(now) if name in snap.decisions else None,
        }
        for name, pool in snap.pools.items()
    }
    exits = [
        {"id": e.replica.replica_id, "variant": e.replica.variant, "state": e.replica.state.value, "code": e.code,
         "error": e.error or None, "streams_resumed": gw.requests.resumed_off.get(e.replica.replica_id, 0)}
        for e in snap.recent_exits
    ]  # fmt: skip
    return {
        "primary": snap.primary,
        "fallback": gw.deployment.fallback,
        "variants": variants,
        "replicas": replicas,
        "recent_exits": exits,
    }


async def _prepare_and_use(gw: Gateway, variant: Variant, request: UseRequest) -> None:
    """Measure the new variant's Profile (the capacity policy sizes by it), then start the rollout."""
    try:
        profile = await asyncio.to_thread(gw.fleet.profile, variant.model, variant.recipe, variant.threads)
        variant = dataclasses.replace(variant, profile=profile)
        await asyncio.to_thread(gw.fleet.controller.use, variant, request.shift_step, request.timeout_s)
    except Exception as exc:  # reported on GET /admin/rollout; the incumbent keeps serving
        logger.error("cannot roll out %s: %s", variant.name, exc)
        gw.fleet.pending = PendingUse(variant.name, variant.recipe, "failed", error=str(exc))
        return
    gw.fleet.variants[variant.name] = variant
    gw.fleet.pending = None


def build_admin_router(top: Gateway) -> APIRouter:
    """The operator API; with several models each route is about the one its `model` names
    (tandem.gateway.models.for_operator), and GET /admin/replicas without one shows them all."""
    router = APIRouter(prefix="/admin", tags=["admin"], route_class=ParsedBodyRoute)  # the edge parsed the body
    tasks: set[asyncio.Task] = set()

    @router.get("/replicas")
    async def replicas(model: str | None = None) -> dict:
        """Every replica (id, variant, recipe, region, state, address, memory, why pending, last load,
        restarts, last error); with several models, each model's (or the `model` asked for)."""
        if top.models and model is None:
            return await asyncio.to_thread(every_models_replicas, top)
        gw = for_operator(top, model)
        return replicas_view(gw, await asyncio.to_thread(gw.fleet.controller.snapshot))

    @router.get("/rollout")
    async def rollout(model: str | None = None) -> dict:
        """The current (or last) rollout: phase, traffic weight, replicas ready; or what is being prepared."""
        gw = for_operator(top, model)
        return rollout_view(gw, await asyncio.to_thread(gw.fleet.controller.snapshot))

    @router.get("/gate")
    async def gate(model: str | None = None) -> dict:
        """The validation gate: state, samples, per-metric statistics and verdicts, decisions with evidence."""
        gw = for_operator(top, model)
        if gw.shadow is None:
            raise APIError(404, "this gateway has no validation gate (no gate: block, no --shadow)", code="no_gate")
        return await asyncio.to_thread(gw.shadow.view)

    @router.post("/gate/promote", status_code=202, response_model=None)
    async def promote(model: str | None = None) -> JSONResponse:
        """Promote the gate's candidate after a PASS (when auto_promote is off): the rollout of `use`."""
        gw = for_operator(top, model)
        if gw.shadow is None:
            raise APIError(404, "this gateway has no validation gate (no gate: block, no --shadow)", code="no_gate")
        try:
            decision = await asyncio.to_thread(gw.shadow.promote_now, gw.clock())
        except ValueError as exc:
            raise APIError(409, str(exc), code="gate_not_passed") from None
        return JSONResponse(decision.to_dict(), status_code=202)

    @router.post("/use", status_code=202, response_model=None)
    async def use(request: UseRequest) -> JSONResponse:
        """Switch the primary traffic to a variant or a recipe: a rollout with zero failed requests."""
        gw = for_operator(top, request.model)
        snap = await asyncio.to_thread(gw.fleet.controller.snapshot)
        if (snap.rollout is not None and not snap.rollout.finished) or (
            gw.fleet.pending and gw.fleet.pending.error is None
        ):
            busy = (
                snap.rollout.new if snap.rollout is not None and not snap.rollout.finished else gw.fleet.pending.variant
            )
            raise APIError(
                409, f"a rollout to {busy!r} is under way; see GET /admin/rollout", code="rollout_in_progress"
            )
        variant = variant_to_use(gw.fleet.variants, snap, request)
        if gw.deployment.policy_name == "capacity" and variant.profile is None:
            gw.fleet.pending = PendingUse(variant.name, variant.recipe, "measuring its profile")
            task = asyncio.create_task(_prepare_and_use(gw, variant, request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:
            try:
                await asyncio.to_thread(gw.fleet.controller.use, variant, request.shift_step, request.timeout_s)
            except (RuntimeError, ValueError) as exc:
                raise APIError(409, str(exc), code="rollout_refused") from None
            gw.fleet.variants[variant.name] = variant
            gw.fleet.pending = None
        logger.info(
            "operator: use %s (%s)%s", variant.name, variant.recipe or "the default recipe",
            f" for model {gw.model}" if gw.model else "",
        )  # fmt: skip
        view = rollout_view(gw, await asyncio.to_thread(gw.fleet.controller.snapshot))
        return JSONResponse(view, status_code=202)

    return router
