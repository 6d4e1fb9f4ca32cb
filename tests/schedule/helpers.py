"""Builders shared by the scheduling tests: a fake clock, loads, contexts and a policy driver."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tandem.contracts import Profile, ReplicaLoad
from tandem.schedule.policies import PolicyState, ScaleContext, ScaleLimits, TokenDemand


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def loads(*outstanding: int, variant: str = "v", region: str = "local", kv: float = 0.0) -> tuple[ReplicaLoad, ...]:
    """One healthy ReplicaLoad per number: that many running requests."""
    return tuple(
        ReplicaLoad(f"{variant}-{i}", region, variant, running=n, waiting=0, kv_used=kv, healthy=True)
        for i, n in enumerate(outstanding)
    )


def spread(total: int, replicas: int) -> tuple[ReplicaLoad, ...]:
    """`total` in-flight requests spread as evenly as possible over `replicas` ready replicas."""
    base, extra = divmod(total, replicas)
    return loads(*(base + (1 if i < extra else 0) for i in range(replicas)))


def profile(decode: dict[int, float], cold_start_s: float = 10.0, prefill: float = 0.0, slots: int = 16) -> Profile:
    return Profile(
        recipe="test",
        hardware="test",
        model="test",
        weight_bytes=1,
        kv_bytes_per_token=1,
        max_slots=slots,
        decode_tokens_per_s=decode,
        prefill_tokens_per_s=prefill,
        ttft_s_p50=0.1,
        cold_start_s=cold_start_s,
    )


@dataclass
class Step:
    now: float
    in_flight: int
    current: int
    desired: int
    state: PolicyState


def drive(
    policy: Callable[[ScaleContext], tuple[int, PolicyState]],
    series: Iterable[tuple[float, int]],
    limits: ScaleLimits,
    start: int,
    ready_delay_ticks: int = 0,
    demand: Callable[[float], TokenDemand] | None = None,
    prof: Profile | None = None,
) -> list[Step]:
    """Run a policy over (time, total in-flight) points; replicas appear at once (or after some ticks)
    and the in-flight total spreads over the ready ones. With no ready replica it is buffered."""
    state, current, pending = PolicyState(), start, []
    steps = []
    for now, total in series:
        pending = [(due, n) for due, n in pending if due > now] + []
        starting = sum(n for _, n in pending)
        ready = max(current - starting, 0)
        ctx = ScaleContext(
            now=now,
            variant="v",
            current_replicas=current,
            ready_replicas=ready,
            loads=spread(total, ready) if ready else (),
            limits=limits,
            state=state,
            demand=demand(now) if demand else TokenDemand(),
            buffered=0 if ready else total,
            profile=prof,
        )
        desired, state = policy(ctx)
        if desired > current and ready_delay_ticks:
            pending.append((now + ready_delay_ticks, desired - current))
        steps.append(Step(now, total, current, desired, state))
        current = desired
    return steps
