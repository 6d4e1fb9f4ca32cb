"""`GET /admin/models`: each model the gateway serves, as an operator of a fleet reads it.

Per model: its state (serving, starting, cold, failed, draining), its primary variant, its
replicas by state (and how many wait for room: pending), the memory its live replicas reserve
(each replica's need, known before it started), the last cold start's seconds (a request that
found no replica ready, to its being served) and how many cold starts there were, and the
requests waiting at the gateway for it now. A single-model gateway shows its one model (name null).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from fastapi import APIRouter

from tandem.cluster.backend import ReplicaState
from tandem.gateway.models import model_state
from tandem.gateway.wiring import Gateway

__all__ = ["build_models_admin_router", "model_view", "models_view"]


def model_view(part: Gateway) -> dict[str, Any]:
    snap = part.fleet.controller.snapshot()
    live = [r for r in part.fleet.backend.list() if r.state is not ReplicaState.STOPPED]
    states = Counter(r.state.value for r in live)
    primary = snap.pools[snap.primary]
    return {
        "name": part.model or None,
        "state": model_state(part),
        "primary": snap.primary,
        "variants": sorted(snap.pools),
        "min_replicas": primary.limits.min_replicas,
        "replicas": {
            "starting": states[ReplicaState.STARTING.value],
            "ready": states[ReplicaState.READY.value],
            "draining": states[ReplicaState.DRAINING.value],
            "pending": sum(1 for r in live if r.pending is not None),
        },  # fmt: skip
        "memory_bytes": sum(r.spec.memory_bytes for r in live),
        "last_cold_start_s": None if part.fleet.cold.last_s is None else round(part.fleet.cold.last_s, 3),
        "cold_starts": part.fleet.cold.count,
        "buffered": sum(part.fleet.inflight.buffered.values()),
        "error": part.fleet.fatal or part.fleet.controller.fatal,
    }


def models_view(gw: Gateway) -> dict[str, Any]:
    return {"models": [model_view(part) for part in gw.parts()]}


def build_models_admin_router(gw: Gateway) -> APIRouter:
    router = APIRouter(prefix="/admin", tags=["admin"])

    @router.get("/models")
    async def models() -> dict:
        """Every model: state, primary, replicas by state, memory reserved, last cold start, requests waiting."""
        return await asyncio.to_thread(models_view, gw)  # snapshots wait for a tick's lock: off the loop

    return router
