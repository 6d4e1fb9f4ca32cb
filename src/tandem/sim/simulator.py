"""simulate: replay a trace through the real controller, policy and router, on a virtual clock.

The fleet is a FakeBackend whose replicas take the Profile's cold start to get ready; each
replica is a SimReplica serving at the Profile's measured speeds. Requests that find no ready
replica wait at the (simulated) gateway, as the real one buffers them. Each `dt` step: arrivals,
dispatch, replica progress; every `tick_s`: one Controller.tick(), exactly as in production. The
result prices the policy: replica-seconds (cost) against time to first token and the share of
output tokens produced within the latency SLO.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.cluster.backend import Replica, ReplicaState
from tandem.cluster.fake import FakeBackend
from tandem.contracts import ReplicaLoad
from tandem.schedule.controller import Controller, ControllerConfig, Pool
from tandem.schedule.policies.context import Policy, ScaleLimits
from tandem.schedule.routers import LeastOutstanding, Router, RouteRequest
from tandem.schedule.traffic import DemandMeter
from tandem.schedule.variant import Variant
from tandem.sim.replica import SimReplica, SimSequence
from tandem.sim.trace import TraceRequest

__all__ = ["SimConfig", "SimResult", "simulate"]


@dataclass(frozen=True)
class SimConfig:
    dt_s: float = 0.5  # simulation step
    tick_s: float = 2.0  # controller interval
    tpot_slo_s: float = 0.1  # a token slower than this is a slow token
    tail_s: float = 600.0  # keep going after the last arrival, so the fleet can scale down
    demand_window_s: float = 10.0
    controller: ControllerConfig = ControllerConfig()


@dataclass
class SimResult:
    served: int = 0
    lost: int = 0  # in flight on a replica that was stopped (must stay 0)
    unserved: int = 0  # still waiting when the simulation ended
    replica_seconds: float = 0.0  # every replica that exists costs, starting and draining ones too
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (time, live replicas) per tick
    ttfts: list[float] = field(default_factory=list)
    tokens: float = 0.0
    slow_tokens: float = 0.0
    decisions: Counter[str] = field(default_factory=Counter)  # "up" / "down"
    max_buffered: int = 0

    @property
    def slo_attainment(self) -> float:
        """The share of output tokens produced at least as fast as the SLO."""
        return 1.0 - self.slow_tokens / self.tokens if self.tokens else 1.0

    def ttft(self, quantile: float) -> float:
        values = sorted(self.ttfts)
        return values[min(int(quantile * len(values)), len(values) - 1)] if values else 0.0

    @property
    def peak(self) -> int:
        return max((n for _, n in self.timeline), default=0)


def simulate(
    trace: Sequence[TraceRequest],
    variant: Variant,
    policy: Policy,
    limits: ScaleLimits,
    router: Router | None = None,
    config: SimConfig = SimConfig(),
    policy_name: str = "policy",
) -> SimResult:
    profile = variant.profile
    if profile is None:
        raise ValueError(f"simulating {variant.name!r} needs its Profile (the replicas' speeds)")
    router = router or LeastOutstanding()
    clock = _Clock(-profile.cold_start_s - config.tick_s)  # warm up: the minimum fleet is ready at t=0
    backend = FakeBackend(clock, startup_s=profile.cold_start_s)
    sims: dict[str, SimReplica] = {}
    demand = DemandMeter(config.demand_window_s)
    gateway: deque[SimSequence] = deque()
    result = SimResult()

    def sim_of(replica: Replica) -> SimReplica:
        if replica.replica_id not in sims:
            sims[replica.replica_id] = SimReplica(replica.replica_id, profile, config.tpot_slo_s)
        return sims[replica.replica_id]

    def load_of(replica: Replica) -> ReplicaLoad:
        sim = sim_of(replica)
        return ReplicaLoad(
            replica.replica_id,
            replica.region,
            replica.variant,
            running=len(sim.running),
            waiting=len(sim.waiting),
            kv_used=len(sim.running) / max(profile.max_slots, 1),
            healthy=replica.state is ReplicaState.READY,
        )

    controller = Controller(
        backend,
        [Pool(variant, policy_name, policy, limits)],
        clock,
        lambda replicas: {r.replica_id: load_of(r) for r in replicas},
        demand=demand.rate,
        buffered=lambda _variant: len(gateway),
        config=config.controller,
    )
    while clock.now < 0:  # warm-up ticks, no traffic
        controller.tick()
        clock.now += config.tick_s
    clock.now, next_tick, arrivals = 0.0, 0.0, deque(trace)
    end = (trace[-1].arrival_s if trace else 0.0) + config.tail_s
    while clock.now < end:
        now, dt = clock.now, config.dt_s
        while arrivals and arrivals[0].arrival_s < now + dt:
            request = arrivals.popleft()
            gateway.append(SimSequence(request.arrival_s, request.prompt_tokens, request.output_tokens))
            demand.record(variant.name, now, prompt_tokens=request.prompt_tokens)
        replicas = backend.list()
        _dispatch(gateway, replicas, router, load_of, sim_of)
        result.max_buffered = max(result.max_buffered, len(gateway))
        present = {r.replica_id for r in replicas}
        for replica_id in [rid for rid in sims if rid not in present]:
            result.lost += sims.pop(replica_id).busy  # stopped with work on it
        for replica in replicas:
            finished, produced = sim_of(replica).step(now, dt)
            demand.record(variant.name, now, output_tokens=int(round(produced)))
            for seq in finished:
                result.served += 1
                result.ttfts.append(seq.first_token_s - seq.arrival_s)
                result.tokens += seq.output_tokens
                result.slow_tokens += seq.slow_tokens
        result.replica_seconds += len(replicas) * dt
        if now >= next_tick:
            report = controller.tick()
            current, desired = report.desired.get(variant.name, (0, 0))
            if desired != current:
                result.decisions["up" if desired > current else "down"] += 1
            result.timeline.append((now, sum(1 for r in backend.list() if r.live)))
            next_tick += config.tick_s
        clock.now = now + dt
    result.unserved = len(gateway) + len(arrivals) + sum(s.busy for s in sims.values())
    return result


def _dispatch(gateway: deque, replicas: Sequence[Replica], router: Router, load_of, sim_of) -> None:
    if not gateway:
        return
    loads = {r.replica_id: load_of(r) for r in replicas}
    by_id = {r.replica_id: r for r in replicas}
    while gateway:
        choice = router.choose(RouteRequest(), list(loads.values()))
        if choice is None:
            return
        sim_of(by_id[choice.replica_id]).submit(gateway.popleft())
        loads[choice.replica_id] = load_of(by_id[choice.replica_id])


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
