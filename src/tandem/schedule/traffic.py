"""What the gateway tells the scheduling layer about traffic: in-flight requests per replica,
requests buffered per variant, and token demand per variant over a sliding window.

`InFlight.loads` turns the gateway's own counts into the `ReplicaLoad`s routers and policies read:
exact and current for requests that went through this gateway, with no scraping delay.
Not thread-safe: update it from the gateway's event loop (the controller reads plain ints).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence

from tandem.cluster.backend import Replica, ReplicaState
from tandem.contracts import ReplicaLoad
from tandem.schedule.policies.context import TokenDemand

__all__ = ["DemandMeter", "InFlight"]


class InFlight:
    def __init__(self, clock: Callable[[], float] = time.monotonic, unreachable_s: float = 5.0) -> None:
        self.clock = clock
        self.unreachable_s = unreachable_s  # how long a replica that refused a connection is skipped
        self.running: Counter[str] = Counter()  # replica id -> requests proxied and not finished
        self.buffered: Counter[str] = Counter()  # variant -> requests waiting at the gateway for a replica
        self.unreachable: dict[str, float] = {}  # replica id -> skipped until (the controller probes it meanwhile)

    def begin(self, replica_id: str) -> None:
        self.running[replica_id] += 1

    def end(self, replica_id: str) -> None:
        self.running[replica_id] -= 1
        if self.running[replica_id] <= 0:
            del self.running[replica_id]

    def mark_unreachable(self, replica_id: str) -> None:
        self.unreachable[replica_id] = self.clock() + self.unreachable_s

    def reachable(self, replica_id: str) -> bool:
        until = self.unreachable.get(replica_id)
        if until is None:
            return True
        if self.clock() >= until:
            del self.unreachable[replica_id]
            return True
        return False

    def loads(self, replicas: Sequence[Replica]) -> dict[str, ReplicaLoad]:
        """A load per replica; only READY ones the gateway has not just seen refusing are healthy."""
        return {
            r.replica_id: ReplicaLoad(
                replica_id=r.replica_id,
                region=r.region,
                variant=r.variant,
                running=self.running.get(r.replica_id, 0),
                waiting=0,
                kv_used=0.0,
                healthy=r.state is ReplicaState.READY and self.reachable(r.replica_id),
            )
            for r in replicas
        }


class DemandMeter:
    """Tokens per second by variant over the last `window_s` seconds (times passed in, never read)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: dict[str, deque[tuple[float, int, int]]] = {}

    def record(self, variant: str, now: float, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        """One finished (or failed) request's tokens; output tokens may also be recorded as they stream."""
        self._events.setdefault(variant, deque()).append((now, prompt_tokens, output_tokens))

    def rate(self, variant: str, now: float) -> TokenDemand:
        events = self._events.get(variant)
        if not events:
            return TokenDemand()
        while events and events[0][0] <= now - self.window_s:
            events.popleft()
        prompt = sum(e[1] for e in events)
        output = sum(e[2] for e in events)
        requests = sum(1 for e in events if e[1])  # a request's prompt is recorded once, with its first event
        return TokenDemand(prompt / self.window_s, output / self.window_s, requests / self.window_s)
