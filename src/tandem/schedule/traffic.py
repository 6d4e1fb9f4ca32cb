"""What the scheduling layer knows about each replica's load, and about demand.

Two sources, merged into the `ReplicaLoad`s routers and policies read (`InFlight.loads`):
- each replica's own report (GET /load: running, waiting, KV fraction in use, healthy), polled by
  the gateway once per controller tick and recorded with `InFlight.report`;
- the gateway's own in-flight counts, exact and current, which refresh a report between polls:
  what the gateway sent since the poll is added to it, what finished is taken off (`estimate`).
A replica with no fresh report (none yet, or the last is older than `report_max_age_s`) is
described by the gateway's counts alone, its KV use unknown (0).

Also requests buffered per variant, and token demand per variant over a sliding window.
Not thread-safe: update it from the gateway's event loop (the controller reads plain values).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tandem.cluster.backend import Replica, ReplicaState
from tandem.contracts import ReplicaLoad
from tandem.schedule.engine_loads import GATEWAY_INFLIGHT
from tandem.schedule.policies.context import TokenDemand

__all__ = ["DemandMeter", "InFlight", "LoadReport", "estimate"]


@dataclass(frozen=True)
class LoadReport:
    """A replica's own ReplicaLoad, when it was polled, and the gateway's in-flight count to it then."""

    load: ReplicaLoad
    at: float
    inflight: int


def estimate(replica: Replica, report: LoadReport | None, inflight: int, reachable: bool) -> ReplicaLoad:
    """The load of `replica` now: its last report, refreshed by the gateway's in-flight change since.

    Outstanding requests (running + waiting) are the report's plus what the gateway sent since minus
    what finished, and never fewer than the gateway has in flight there now. New requests count as
    running (the engine admits them at its next step) unless the report had a queue; KV use and the prompt
    tokens still to prefill are the report's. Healthy: READY, not just refused a connection, and (if it
    reported) says so itself.
    """
    healthy = replica.state is ReplicaState.READY and reachable
    if report is None:
        running, waiting, kv_used, source, prefill = inflight, 0, 0.0, GATEWAY_INFLIGHT, 0
    else:
        r = report.load
        outstanding = max(inflight, r.running + r.waiting + inflight - report.inflight)
        waiting = min(r.waiting, outstanding)
        running, kv_used, source, prefill = outstanding - waiting, r.kv_used, r.source, r.prefill_tokens
        healthy = healthy and r.healthy
    return ReplicaLoad(
        replica_id=replica.replica_id,
        region=replica.region,
        variant=replica.variant,
        running=running,
        waiting=waiting,
        kv_used=kv_used,
        healthy=healthy,
        source=source,
        prefill_tokens=prefill,
    )


class InFlight:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, unreachable_s: float = 5.0, report_max_age_s: float = 5.0
    ) -> None:
        self.clock = clock
        self.unreachable_s = unreachable_s  # how long a replica that refused a connection is skipped
        self.report_max_age_s = report_max_age_s  # an older report is ignored (the replica stopped answering)
        self.running: Counter[str] = Counter()  # replica id -> requests proxied and not finished
        self.buffered: Counter[str] = Counter()  # variant -> requests waiting at the gateway for a replica
        self.unreachable: dict[str, float] = {}  # replica id -> skipped until (the controller probes it meanwhile)
        self.reports: dict[str, LoadReport] = {}  # replica id -> its last GET /load

    def report(self, load: ReplicaLoad) -> None:
        """Record what a replica just reported about itself (its id is the gateway's name for it)."""
        self.reports[load.replica_id] = LoadReport(load, self.clock(), self.running.get(load.replica_id, 0))

    def forget(self, keep: Sequence[str]) -> None:
        """Drop the reports of replicas no longer in the fleet."""
        for replica_id in set(self.reports) - set(keep):
            del self.reports[replica_id]

    def begin(self, replica_id: str) -> None:
        self.running[replica_id] += 1

    def end(self, replica_id: str) -> None:
        self.running[replica_id] -= 1
        if self.running[replica_id] <= 0:
            del self.running[replica_id]

    def mark_unreachable(self, replica_id: str, for_s: float | None = None) -> None:
        """Skip `replica_id` for `for_s` seconds (default unreachable_s; math.inf: until mark_reachable)."""
        self.unreachable[replica_id] = self.clock() + (self.unreachable_s if for_s is None else for_s)

    def mark_reachable(self, replica_id: str) -> None:
        self.unreachable.pop(replica_id, None)

    def reachable(self, replica_id: str) -> bool:
        until = self.unreachable.get(replica_id)
        if until is None:
            return True
        if self.clock() >= until:
            del self.unreachable[replica_id]
            return True
        return False

    def fresh_report(self, replica_id: str) -> LoadReport | None:
        report = self.reports.get(replica_id)
        if report is None or self.clock() - report.at > self.report_max_age_s:
            return None
        return report

    def loads(self, replicas: Sequence[Replica]) -> dict[str, ReplicaLoad]:
        """A load per replica (`estimate`); only READY ones the gateway has not just seen refusing are healthy."""
        return {
            r.replica_id: estimate(
                r, self.fresh_report(r.replica_id), self.running.get(r.replica_id, 0), self.reachable(r.replica_id)
            )
            for r in replicas
        }


class DemandMeter:
    """Tokens per second by variant over the last `window_s` seconds (times passed in, never read).

    `record` counts finished requests (their tokens, and whether they met the SLO when the caller
    knows); `arrive` counts requests as they come in (their prompt tokens), so a policy sees a burst
    the moment it arrives rather than once the fleet has served it. Both are optional to feed: the
    fields of TokenDemand they fill stay None when nothing was fed.

    The short tail of the outputs comes from the last `lengths_kept` whole requests recorded (a prompt and
    an output together) that are judged on TPOT (two output tokens or more): `TokenDemand.short_output_tokens`
    is the `length_quantile` quantile of their output tokens (nearest rank). A count, not a time window: a
    quiet minute and a busy second both give enough requests for a tail. `arrive` also keeps running totals
    (`TokenDemand.arrived_requests_total`, `arrived_prompt_tokens_total`), so a policy can difference them
    per tick, finer than the window.
    """

    def __init__(self, window_s: float = 10.0, lengths_kept: int = 256, length_quantile: float = 0.05) -> None:
        if window_s <= 0 or lengths_kept < 1 or not 0 <= length_quantile <= 0.5:
            raise ValueError("DemandMeter needs window_s > 0, lengths_kept >= 1 and length_quantile in [0, 0.5]")
        self.window_s = window_s
        self.length_quantile = length_quantile
        self._lengths: dict[str, deque[int]] = {}
        self._lengths_kept = lengths_kept
        self._events: dict[str, deque[tuple[float, int, int]]] = {}
        self._arrivals: dict[str, deque[tuple[float, int]]] = {}
        self._arrived_totals: dict[str, tuple[int, int]] = {}  # variant -> (requests, prompt tokens) ever arrived
        self._outcomes: dict[str, deque[tuple[float, bool]]] = {}

    def record(
        self, variant: str, now: float, prompt_tokens: int = 0, output_tokens: int = 0, within_slo: bool | None = None
    ) -> None:
        """One finished (or failed) request's tokens; output tokens may also be recorded as they stream."""
        self._events.setdefault(variant, deque()).append((now, prompt_tokens, output_tokens))
        if prompt_tokens > 0 and output_tokens >= 2:
            self._lengths.setdefault(variant, deque(maxlen=self._lengths_kept)).append(output_tokens)
        if within_slo is not None:
            self._outcomes.setdefault(variant, deque()).append((now, within_slo))

    def outcome(self, variant: str, now: float, within_slo: bool) -> None:
        """Whether one finished request met the SLO, apart from its tokens (a gateway judges it where it relays
        the answer; its dispatcher records the tokens)."""
        self._outcomes.setdefault(variant, deque()).append((now, within_slo))

    def arrive(self, variant: str, now: float, prompt_tokens: int) -> None:
        """One request arrived for `variant` with this many prompt tokens."""
        self._arrivals.setdefault(variant, deque()).append((now, prompt_tokens))
        count, tokens = self._arrived_totals.get(variant, (0, 0))
        self._arrived_totals[variant] = (count + 1, tokens + prompt_tokens)

    def _trim(self, events: deque | None, now: float) -> deque:
        while events and events[0][0] <= now - self.window_s:
            events.popleft()
        return events if events is not None else deque()

    def rate(self, variant: str, now: float) -> TokenDemand:
        events = self._trim(self._events.get(variant), now)
        arrivals = self._trim(self._arrivals.get(variant), now) if variant in self._arrivals else None
        outcomes = self._trim(self._outcomes.get(variant), now) if variant in self._outcomes else None
        prompt = sum(e[1] for e in events)
        output = sum(e[2] for e in events)
        requests = sum(1 for e in events if e[1])  # a request's prompt is recorded once, with its first event
        lengths = self._lengths.get(variant)
        short = None
        if lengths:
            outputs = sorted(lengths)
            short = float(outputs[min(int(self.length_quantile * len(outputs)), len(outputs) - 1)])
        return TokenDemand(
            prompt / self.window_s,
            output / self.window_s,
            requests / self.window_s,
            arrived_requests_per_s=len(arrivals) / self.window_s if arrivals is not None else None,
            arrived_prompt_tokens_per_s=sum(a[1] for a in arrivals) / self.window_s if arrivals is not None else None,
            slo_attainment=sum(1 for o in outcomes if o[1]) / len(outcomes) if outcomes else None,
            arrived_requests_total=self._arrived_totals[variant][0] if variant in self._arrived_totals else None,
            arrived_prompt_tokens_total=self._arrived_totals[variant][1] if variant in self._arrived_totals else None,
            short_output_tokens=short,
        )
