"""Polling replicas' own loads: GET /load of every ready or draining replica, once per controller tick.

Each answer is a `ReplicaLoad` (running, waiting, KV fraction in use, healthy) recorded in the
gateway's InFlight, where the controller's policies and the routers read it, refreshed between
polls by the gateway's own in-flight counts (tandem.schedule.traffic.estimate). A replica that does
not answer in time keeps its last report until that goes stale. A report that names another
replica (a port reused by a process the gateway did not start) is refused. A replica that answers
is routed to again if a request's deadline had declared it unresponsive (tandem.gateway.liveness).

A replica of an external engine (vLLM, SGLang, llama.cpp) has no GET /load: its metrics adapter
reads its Prometheus text instead (tandem.schedule.engine_loads); with none (`metrics: {adapter:
none}`, or text the adapter cannot read) its readiness path is asked whether it answers, and the
gateway's own in-flight counts stand for its load (source `gateway-inflight` on GET /admin/replicas).

With the `kv-aware` router, the same tick reads each replica's KV events (tandem.gateway.kv_feed).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from tandem.cluster.backend import Replica, ReplicaState
from tandem.contracts import ReplicaLoad
from tandem.gateway.fleet import Fleet
from tandem.gateway.kv_feed import poll_kv_events
from tandem.gateway.upstream import Upstream
from tandem.schedule.engine_loads import load_from_metrics

__all__ = ["parse_load", "poll_loads"]

logger = logging.getLogger("tandem.gateway")

_POLLED = (ReplicaState.READY, ReplicaState.DRAINING)


def parse_load(replica: Replica, payload: Any) -> ReplicaLoad:
    """A replica's GET /load answer as a ReplicaLoad; ValueError if it is malformed or names another replica."""
    if not isinstance(payload, dict):
        raise ValueError("not a JSON object")
    if payload.get("replica_id") != replica.replica_id:
        raise ValueError(f"it reports being {payload.get('replica_id')!r}")
    try:
        load = ReplicaLoad(
            replica_id=replica.replica_id,
            region=replica.region,
            variant=replica.variant,
            running=int(payload["running"]),
            waiting=int(payload["waiting"]),
            kv_used=float(payload["kv_used"]),
            healthy=bool(payload["healthy"]),
            prefill_tokens=int(payload.get("prefill_tokens", 0)),  # older replicas do not report it: 0
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed load report ({exc})") from None
    if load.running < 0 or load.waiting < 0 or load.prefill_tokens < 0 or not 0.0 <= load.kv_used <= 1.0:
        raise ValueError(f"impossible load report {payload}")
    return load


async def _poll_external(client: httpx.AsyncClient, replica: Replica, timeout_s: float) -> ReplicaLoad | bool:
    """An external engine's load from its metrics; else whether it answers at all (True: reachable)."""
    engine = replica.spec.engine
    assert engine is not None
    if engine.metrics_adapter != "none":
        try:
            response = await client.get(replica.url + engine.metrics_path, timeout=timeout_s)
            if response.status_code == 200:
                return load_from_metrics(
                    engine.metrics_adapter, response.text, replica_id=replica.replica_id, region=replica.region,
                    variant=replica.variant,
                )  # fmt: skip
            logger.warning("GET %s of %s answered %d", engine.metrics_path, replica.replica_id, response.status_code)
        except httpx.HTTPError:
            return False
        except ValueError as exc:
            logger.warning("ignoring the metrics of %s at %s: %s", replica.replica_id, replica.url, exc)
    try:
        return (await client.get(replica.url + engine.ready_path, timeout=timeout_s)).status_code == 200
    except httpx.HTTPError:
        return False


async def _poll_one(client: httpx.AsyncClient, replica: Replica, timeout_s: float) -> ReplicaLoad | bool | None:
    if replica.spec.engine is not None:
        return await _poll_external(client, replica, timeout_s)
    try:
        response = await client.get(replica.url + "/load", timeout=timeout_s)
        if response.status_code != 200:
            return None
        return parse_load(replica, response.json())
    except httpx.HTTPError:
        return None  # the controller's probe notices a replica that is down
    except ValueError as exc:
        logger.warning("ignoring GET /load of %s at %s: %s", replica.replica_id, replica.url, exc)
        return None


async def poll_loads(fleet: Fleet, upstream: Upstream) -> int:
    """Poll every ready or draining replica at once; record the answers. Returns how many answered."""
    live = fleet.backend.list()
    replicas = [r for r in live if r.state in _POLLED]
    fleet.inflight.forget([r.replica_id for r in replicas])
    upstream.liveness.forget([r.replica_id for r in live])
    if not replicas or upstream.client is None:
        return 0
    loads = await asyncio.gather(*(_poll_one(upstream.client, r, upstream.load_timeout_s) for r in replicas))
    for replica, load in zip(replicas, loads, strict=True):
        if isinstance(load, ReplicaLoad):
            fleet.inflight.report(load)
        if load:  # it answers: if a deadline had declared it unresponsive, no more
            upstream.liveness.revive(replica.replica_id)
    if fleet.kv is not None:  # the kv-aware router's index: the replicas' KV events, on the same tick
        await poll_kv_events(upstream.client, live, fleet.kv, upstream.load_timeout_s)
    return sum(bool(load) for load in loads)
