"""The fleet: the replicas and what decides them. The backend that runs them, the Controller (its
policy, rollouts and restarts), the in-flight and demand estimates the policies and routers read,
the scheduling metrics, every variant known by name, an operator's rollout being prepared, and the
error that ends the process when the primary can never start.

Requests waiting for a replica sleep on `wait_for_change` until something changes (a tick, a
request ending, a drain: `notify`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tandem.cluster.backend import Backend, ReplicaState
from tandem.deployment import ProfileSource
from tandem.gateway.cold_start import ColdStarts
from tandem.gateway.kv_index import KVIndex
from tandem.schedule.controller import Controller
from tandem.schedule.metrics import SchedulerMetrics
from tandem.schedule.profiles import cached_profile
from tandem.schedule.traffic import DemandMeter, InFlight
from tandem.schedule.variant import Variant

__all__ = ["Fleet", "PendingUse"]


@dataclass
class PendingUse:
    """An operator's `POST /admin/use` being prepared (its Profile measured) before the rollout starts."""

    variant: str
    recipe: str | None
    step: str
    error: str | None = None


@dataclass
class Fleet:
    backend: Backend
    controller: Controller
    inflight: InFlight
    demand: DemandMeter
    metrics: SchedulerMetrics
    variants: dict[str, Variant]  # every variant known by name: the deployment's and those rolled out since
    profile: ProfileSource = cached_profile  # measures a rolled-out recipe's Profile
    pending: PendingUse | None = None
    fatal: str | None = None  # the primary can never start: the process exits non-zero with this
    cold: ColdStarts = field(default_factory=ColdStarts)  # scale from zero, as the requests waiting felt it
    kv: KVIndex | None = None  # which replica holds which prefix blocks (the kv-aware router's; else None)
    _changed: asyncio.Event | None = field(default=None, repr=False)

    def ready(self) -> bool:
        """Whether the primary variant has a ready replica."""
        primary = self.controller.primary
        return any(r.variant == primary and r.state is ReplicaState.READY for r in self.backend.list())

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_change(self, timeout_s: float) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        try:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        except TimeoutError:
            pass
