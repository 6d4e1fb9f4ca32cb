"""Making room for a model that needs a replica now, by scaling idle models down (a fleet of models).

Once per control-loop tick, after every model's own tick: a model with a request waiting at the
gateway and a replica waiting for room (pending `no-room`) asks `tandem.schedule.memory.
choose_evictions` which other models' replicas to give up (idle longest first, never below a
model's `min`, nothing when no node can be made to hold the need: its docstring is the contract).
A model chosen is scaled down by its own controller: its pools' policies are capped at what it
keeps (`capped`), so the controller drains the replicas the usual way (in-flight requests finish)
and its policy does not start them again; the cap is lifted as soon as that model has a request
waiting itself. The waiting replica is placed by the backend once the drained processes exited.

A model is idle since the last tick it had a request in flight or waiting (`Activity`); the
gateway's clock is passed in.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tandem.cluster.backend import ReplicaState
from tandem.gateway.model_backend import shared_backend
from tandem.gateway.wiring import Gateway
from tandem.schedule.controller import Pool
from tandem.schedule.memory import LOCAL_NODE, EvictionCandidate, Evictions, choose_evictions
from tandem.schedule.policies.context import Policy, PolicyState, ScaleContext

__all__ = ["DEFAULT_MIN_IDLE_S", "RoomMaker", "capped"]

logger = logging.getLogger("tandem.gateway")

DEFAULT_MIN_IDLE_S = 30.0  # a model idle for less is never scaled down for another


def capped(policy: Policy, most: int) -> Policy:
    """`policy`, never asking for more than `most` replicas."""

    def capped_policy(ctx: ScaleContext) -> tuple[int, PolicyState]:
        desired, state = policy(ctx)
        return min(desired, most), state

    return capped_policy


def _busy(part: Gateway) -> bool:
    return any(part.fleet.inflight.running.values()) or any(part.fleet.inflight.buffered.values())


@dataclass
class RoomMaker:
    min_idle_s: float = DEFAULT_MIN_IDLE_S
    free: Callable[[], Mapping[str, int]] | None = None  # bytes free per node now (default: the backend's room())
    last_busy: dict[str, float] = field(default_factory=dict)
    held: dict[tuple[str, str], Pool] = field(default_factory=dict)  # (model, variant) -> its pool before the cap

    def tick(self, gw: Gateway, now: float) -> Evictions | None:
        for name, part in gw.models.items():
            if _busy(part) or name not in self.last_busy:
                self.last_busy[name] = now
            if part.fleet.inflight.buffered:
                self._release(name, part)
        for name, part in gw.models.items():
            waiting = [
                r for r in part.fleet.backend.list()
                if r.pending is not None and r.pending.cause == "no-room"
            ]  # fmt: skip
            if not part.fleet.inflight.buffered or not waiting:
                continue
            evictions = choose_evictions(
                max(r.spec.memory_bytes for r in waiting), self._free(gw), self._candidates(gw, now),
                for_model=name, min_idle_s=self.min_idle_s,
            )  # fmt: skip
            if evictions is not None:
                self._scale_down(gw, evictions)
                logger.info(
                    "making room for model %s on node %s: scaling down %s (%d bytes)", name, evictions.node,
                    ", ".join(evictions.replica_ids), evictions.freed_bytes,
                )  # fmt: skip
                return evictions  # one plan a tick: the next sees what it freed
        return None

    def _free(self, gw: Gateway) -> Mapping[str, int]:
        if self.free is not None:
            return self.free()
        room = getattr(shared_backend(gw.fleet.backend), "room", None)  # LocalBackend, FakeBackend: NodeRooms
        return {node.name: node.free_bytes for node in room()} if room is not None else {}

    def _candidates(self, gw: Gateway, now: float) -> list[EvictionCandidate]:
        out = []
        for name, part in gw.models.items():
            rollout = part.fleet.controller.rollout
            if rollout is not None and not rollout.finished:
                continue  # a model mid-rollout is not idle
            pools = part.fleet.controller.pools
            replicas = [r for r in part.fleet.backend.list() if r.state is ReplicaState.READY]
            for variant, pool in pools.items():
                mine = [r for r in replicas if r.variant == variant]
                spare = len(mine) - pool.limits.min_replicas
                out += [
                    EvictionCandidate(
                        r.replica_id, name, r.spec.memory_bytes, now - self.last_busy.get(name, now), spare,
                        node=r.node or LOCAL_NODE,
                    )
                    for r in mine
                ]  # fmt: skip
        return out

    def _scale_down(self, gw: Gateway, evictions: Evictions) -> None:
        chosen = set(evictions.replica_ids)
        for name, part in gw.models.items():
            controller = part.fleet.controller
            for variant, pool in list(controller.pools.items()):
                live = [r for r in part.fleet.backend.list() if r.variant == variant and r.live]
                going = sum(1 for r in live if r.replica_id in chosen)
                if going:
                    self.held.setdefault((name, variant), pool)
                    most = max(pool.limits.min_replicas, len(live) - going)
                    controller.pools[variant] = dataclasses.replace(pool, policy=capped(pool.policy, most))

    def _release(self, name: str, part: Gateway) -> None:
        for (model, variant), pool in list(self.held.items()):
            if model == name:
                del self.held[(model, variant)]
                if variant in part.fleet.controller.pools:
                    part.fleet.controller.pools[variant] = pool
