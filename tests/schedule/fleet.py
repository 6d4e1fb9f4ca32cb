"""A small in-process stand-in for the gateway, for controller and rollout tests on a fake clock.

Requests pick a variant by the controller's weights, a replica by a router over the gateway's own
in-flight counts, and hold it for a number of seconds. A request fails if no replica was ready for
it, or if its replica was stopped while it was still in flight; `stop` is watched to catch that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.cluster import FakeBackend
from tandem.schedule.controller import Controller
from tandem.schedule.routers import LeastOutstanding, RouteRequest
from tandem.schedule.traffic import InFlight


@dataclass
class Request:
    variant: str
    replica_id: str
    ends_at: float


@dataclass
class Traffic:
    backend: FakeBackend
    inflight: InFlight
    controller: Controller | None = None
    active: list[Request] = field(default_factory=list)
    served: int = 0
    failed: int = 0
    cut: list[str] = field(default_factory=list)  # replicas stopped with requests in flight
    served_by: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        real_stop = self.backend.stop

        def watched_stop(replica_id: str) -> None:
            if self.inflight.running.get(replica_id, 0):
                self.cut.append(replica_id)
            real_stop(replica_id)

        self.backend.stop = watched_stop

    def send(self, count: int, now: float, duration_s: float, region: str | None = None) -> None:
        weights = self.controller.weights() if self.controller else {}
        loads = self.inflight.loads(self.backend.list())
        for _ in range(count):
            ready = [load for load in loads.values() if load.healthy]
            by_weight = sorted(weights, key=lambda v: -weights[v])
            variants = [v for v in by_weight if weights[v] > 0 and any(r.variant == v for r in ready)]
            pool = [r for r in ready if not variants or r.variant == variants[0]]
            choice = LeastOutstanding().choose(RouteRequest(region=region), pool)
            if choice is None:
                self.failed += 1
                continue
            self.inflight.begin(choice.replica_id)
            loads = self.inflight.loads(self.backend.list())
            self.active.append(Request(choice.variant, choice.replica_id, now + duration_s))

    def finish(self, now: float) -> None:
        live = {r.replica_id for r in self.backend.list()}
        for request in [r for r in self.active if r.ends_at <= now]:
            self.active.remove(request)
            if request.replica_id in live:
                self.served += 1
                self.served_by[request.variant] = self.served_by.get(request.variant, 0) + 1
            else:
                self.failed += 1
            self.inflight.end(request.replica_id)
