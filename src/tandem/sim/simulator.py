"""simulate: replay a trace through the real controller, policy and router, on a virtual clock.

The fleet is a FakeBackend whose replicas take the Profile's cold start to get ready; each
replica is a SimReplica serving at the Profile's measured speeds. Requests that find no ready
replica wait at the (simulated) gateway, as the real one buffers them. Each `dt` step: arrivals,
dispatch (the real router over the replicas' loads), replica progress; every `tick_s`: one
Controller.tick(), exactly as in production. The policies see what the gateway sees: in-flight
and buffered requests, and a DemandMeter fed each request's tokens when it finishes.

Before the trace's window [0, duration) the fleet is warmed up: it starts at the policy's minimum
and serves `warmup` requests (by default the trace's own first `warmup_s` seconds, replayed before
0), so a policy meets the trace already sized for it, as a fleet in production would (a trace's
prefix block ids are renamed in that replay: the caches start full, but not of the window's own
prefixes). Cost
(replica-seconds, node-seconds) is counted inside the window; latency for the requests that arrive
in it, each followed to its last token.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tandem.cluster.backend import Replica, ReplicaState
from tandem.cluster.fake import FakeBackend
from tandem.contracts import Profile
from tandem.schedule.controller import Controller, ControllerConfig, Pool
from tandem.schedule.policies.context import Policy, ScaleLimits
from tandem.schedule.policies.prefill_budget import PrefillBudget, admission
from tandem.schedule.routers import AdmissionCap, LeastOutstanding, Router
from tandem.schedule.traffic import DemandMeter
from tandem.schedule.variant import Variant
from tandem.sim.replica import SimReplica, SimSequence, decode_iteration_times
from tandem.sim.router_view import LoadReader, RouterView
from tandem.sim.trace import TraceRequest

__all__ = ["SimConfig", "SimResult", "simulate"]


@dataclass(frozen=True)
class SimConfig:
    dt_s: float = 0.5  # simulation step: routing and load reports are this fresh
    tick_s: float = 2.0  # controller interval
    ttft_slo_s: float = 2.0  # a request meets the SLO when its time to first token ...
    tpot_slo_s: float = 0.1  # ... and its mean time per output token are both within these
    tail_s: float = 900.0  # at most this long after the window to let the last requests finish
    warmup_s: float = 600.0  # replay the trace's first seconds before 0 (0: start cold at the minimum)
    demand_window_s: float = 10.0
    prefill_chunk_tokens: int = 512  # prompt tokens per engine iteration (tandem's max_prefill_tokens)
    boot_s: float | None = None  # how long a replica takes to start, when measured apart (None: the Profile's)
    run_tail: bool = False  # keep ticking for all of tail_s, even once every request is done
    admission_cap: bool = False  # the router holds each replica to the SLO batch of the live mix (AdmissionCap)
    prefix_block_tokens: int = 512  # a replica's prefix block cache (traces with block ids: Mooncake's 512); 0: none
    token_cap: bool = True  # ... and, with admission_cap, to the prompt tokens its rows can carry (PrefillBudget)
    pace: bool = True  # ... and, with token_cap, sends each replica prompt tokens no faster than its rows allow
    # With admission_cap, while requests wait at the gateway, dispatch this many times a step: a gateway
    # dispatches on every event, and a replica refusing a prompt now may take it as soon as its prefill is done.
    dispatch_substeps: int = 5
    controller: ControllerConfig = ControllerConfig()


@dataclass
class SimResult:
    duration_s: float
    ttft_slo_s: float
    tpot_slo_s: float
    requests: list[SimSequence] = field(default_factory=list)  # those arriving in the window
    lost_requests: list[SimSequence] = field(default_factory=list)  # in flight on a replica that was stopped
    replica_seconds: float = 0.0  # in the window; starting and draining replicas cost too
    node_seconds: float = 0.0  # in the window, when a node shape was given
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (time, live, ready) per tick
    held: list[tuple[float, int]] = field(default_factory=list)  # (time, replicas holding memory) at each change
    decisions: Counter[str] = field(default_factory=Counter)  # "up" / "down"
    max_buffered: int = 0  # most requests waiting at the gateway at once
    min_live: int | None = None  # fewest replicas alive at any step of the window
    max_live: int = 0
    sim_seconds: float = 0.0  # virtual time simulated, warm-up and tail included

    @property
    def served(self) -> int:
        return sum(1 for r in self.requests if r.finished_s is not None)

    @property
    def lost(self) -> int:
        """Requests cut off by a replica being stopped under them (must stay 0)."""
        return len(self.lost_requests)

    @property
    def unserved(self) -> int:
        """Window requests that never finished and were not lost (still queued or running at the end)."""
        lost = {id(r) for r in self.lost_requests}
        return sum(1 for r in self.requests if r.finished_s is None and id(r) not in lost)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests if r.finished_s is not None)

    def meets_slo(self, seq: SimSequence) -> bool:
        return seq.finished_s is not None and seq.ttft_s <= self.ttft_slo_s and seq.tpot_s <= self.tpot_slo_s

    @property
    def slo_attainment(self) -> float:
        """The share of window requests that finished within both the TTFT and the TPOT SLO."""
        return sum(1 for r in self.requests if self.meets_slo(r)) / len(self.requests) if self.requests else 1.0

    def quantile(self, what: str, q: float) -> float:
        """`what` ("ttft" or "tpot") at quantile q over finished requests (nearest rank)."""
        values = sorted(getattr(r, f"{what}_s") for r in self.requests if r.finished_s is not None)
        return values[min(int(q * len(values)), len(values) - 1)] if values else math.nan

    @property
    def prefix_hit_rate(self) -> float | None:
        """The share of finished window requests' prompt tokens a replica's block cache held (None:
        the trace carries no block ids)."""
        done = [r for r in self.requests if r.finished_s is not None]
        if not any(r.blocks for r in done):
            return None
        prompt = sum(r.prompt_tokens for r in done)
        return sum(r.cached_tokens for r in done) / prompt if prompt else 0.0

    @property
    def peak(self) -> int:
        return self.max_live

    @property
    def mean_replicas(self) -> float:
        return self.replica_seconds / self.duration_s if self.duration_s else 0.0


def simulate(
    trace: Sequence[TraceRequest],
    variant: Variant,
    policy: Policy,
    limits: ScaleLimits,
    router: Router | None = None,
    config: SimConfig = SimConfig(),
    policy_name: str = "policy",
    *,
    duration_s: float | None = None,
    warmup: Sequence[TraceRequest] | None = None,
    nodes_for: Callable[[int], int] | None = None,
    serving: Profile | None = None,
) -> SimResult:
    """Serve `trace` (arrivals from 0) with `variant`'s replicas sized by `policy`.

    `duration_s`: the window (default: up to the last arrival). `warmup`: requests with arrival
    times before 0 (default: the trace's first `config.warmup_s` seconds, shifted before 0).
    `nodes_for(n)`: the nodes n live replicas occupy (packing), integrated into node_seconds.
    `serving`: the speeds the replicas really have, when they differ from the Profile the scheduler
    was given (the variant's); default: the variant's.
    """
    profile = variant.profile
    if profile is None:
        raise ValueError(f"simulating {variant.name!r} needs its Profile (the replicas' speeds)")
    router = router or LeastOutstanding()
    duration = duration_s if duration_s is not None else (trace[-1].arrival_s if trace else 0.0)
    if warmup is None:
        warm = [r for r in trace if r.arrival_s < config.warmup_s]
        span = max(config.warmup_s, warm[-1].arrival_s) if warm else 0.0
        # The replayed requests' blocks are renamed (~id): they fill the caches as much as the real ones
        # would, but the window's own requests find none of their prefixes cached by their own replay.
        warmup = [replace(r, arrival_s=r.arrival_s - span, blocks=tuple(~b for b in r.blocks)) for r in warm]
    start = min((r.arrival_s for r in warmup), default=0.0)
    boot = profile.cold_start_s if config.boot_s is None else config.boot_s
    clock = _Clock(math.floor(start) - boot - config.tick_s)  # the minimum fleet is ready first
    backend = FakeBackend(clock, startup_s=boot)
    sims: dict[str, SimReplica] = {}
    iteration_s = decode_iteration_times(serving or profile)  # every replica's, computed once
    # A trace without block ids would only keep the caches' books: no request could reuse a block.
    block_tokens = config.prefix_block_tokens if any(r.blocks for r in (*warmup, *trace)) else 0
    demand = DemandMeter(config.demand_window_s)
    gateway: deque[SimSequence] = deque()
    result = SimResult(duration, config.ttft_slo_s, config.tpot_slo_s)
    cap: list[int | None] = [None]  # the admission cap, refreshed every tick from the live length mix
    budget: list[PrefillBudget | None] = [None]  # the token cap, refreshed with it
    if config.admission_cap:
        router = AdmissionCap(
            router, lambda: cap[0], (lambda: budget[0]) if config.token_cap else None, clock if config.pace else None
        )

    def sim_of(replica: Replica) -> SimReplica:
        if replica.replica_id not in sims:
            sims[replica.replica_id] = SimReplica(
                replica.replica_id, serving or profile, config.prefill_chunk_tokens, block_tokens, iteration_s,
            )  # fmt: skip
        return sims[replica.replica_id]

    load_of = LoadReader(sim_of, profile.max_slots)
    view = RouterView(router, load_of)

    controller = Controller(
        backend,
        [Pool(variant, policy_name, policy, limits)],
        clock,
        lambda replicas: {r.replica_id: load_of(r) for r in replicas},
        demand=demand.rate,
        buffered=lambda _variant: len(gateway),
        config=config.controller,
    )
    while clock.now < start:  # warm-up ticks, no traffic: the minimum fleet starts
        controller.tick()
        clock.now += config.tick_s
    arrivals = deque(
        (SimSequence(r.arrival_s, r.prompt_tokens, r.output_tokens, blocks=r.blocks, tenant_class=r.tenant_class,
                     priority=r.priority), r.arrival_s >= 0)
        for r in (*warmup, *trace)
    )  # fmt: skip
    in_flight = 0  # requests arrived and not finished (or lost)
    next_tick, end = clock.now, duration + config.tail_s
    nodes_cache: dict[int, int] = {}
    # The fleet changes only in a controller tick: between two, the replicas, their sims and the live count are kept
    # (and what the router is shown of them: tandem.sim.router_view).
    fleet_changed = True
    replicas: list[Replica] = []
    fleet: list[tuple[Replica, SimReplica]] = []
    live = 0
    while clock.now < end:
        now, dt = clock.now, config.dt_s
        while arrivals and arrivals[0][0].arrival_s < now + dt:
            seq, counted = arrivals.popleft()
            _enqueue(gateway, seq)
            demand.arrive(variant.name, seq.arrival_s, seq.prompt_tokens)
            in_flight += 1
            if counted:
                result.requests.append(seq)
        if fleet_changed:  # the controller ticked: the backend's list (and each replica's health) may differ
            replicas = backend.list()
            fleet = [(r, sim_of(r)) for r in replicas]
            view.reset(fleet)
            live = sum(1 for r in replicas if r.live)
            present = {r.replica_id for r in replicas}
            for replica_id in [rid for rid in sims if rid not in present]:
                gone = sims.pop(replica_id).in_flight()  # stopped with work on it
                load_of.forget(replica_id)
                result.lost_requests.extend(gone)
                in_flight -= len(gone)
            fleet_changed = False
        view.dispatch(gateway, now)
        result.max_buffered = max(result.max_buffered, len(gateway))
        parts = config.dispatch_substeps if config.admission_cap and gateway and config.dispatch_substeps > 1 else 1
        for part in range(parts):
            t, h = now + part * dt / parts, dt / parts
            if part:
                view.dispatch(gateway, t)
            for replica, sim in fleet:
                if not (sim.waiting or sim.prefilling or sim.decoding):
                    continue  # idle: a step would change nothing
                version = sim.version
                for seq in sim.step(t, h):
                    in_flight -= 1
                    # As the gateway counts: a request's prompt and output tokens once it has finished.
                    demand.record(variant.name, seq.finished_s, seq.prompt_tokens, seq.output_tokens,
                                  result.meets_slo(seq))  # fmt: skip
                if sim.version != version:
                    view.stepped(replica.replica_id)
        if 0 <= now < duration:
            result.replica_seconds += len(replicas) * min(dt, duration - now)
            result.min_live = live if result.min_live is None else min(result.min_live, live)
            result.max_live = max(result.max_live, live)
            if not result.held or result.held[-1][1] != len(replicas):  # starting, ready and draining hold memory
                result.held.append((now, len(replicas)))
            if nodes_for is not None:
                if len(replicas) not in nodes_cache:
                    nodes_cache[len(replicas)] = nodes_for(len(replicas))
                result.node_seconds += nodes_cache[len(replicas)] * min(dt, duration - now)
        if now >= next_tick:
            if config.admission_cap:
                mix = demand.rate(variant.name, now)
                limit, tokens = admission(profile, config.tpot_slo_s, mix, 0.75 * config.ttft_slo_s,
                                          config.prefill_chunk_tokens)  # fmt: skip
                cap[0], budget[0] = limit or cap[0], tokens or budget[0]
            report = controller.tick()
            current, desired = report.desired.get(variant.name, (0, 0))
            if desired != current and now >= 0:
                result.decisions["up" if desired > current else "down"] += 1
            listed = backend.list()
            ready = sum(1 for r in listed if r.state is ReplicaState.READY)
            result.timeline.append((now, sum(1 for r in listed if r.live), ready))
            next_tick += config.tick_s
            fleet_changed = True
        clock.now = now + dt
        if not config.run_tail and now >= duration and not arrivals and in_flight == 0:
            break
    result.sim_seconds = clock.now - start
    return result


def _enqueue(gateway: deque, seq: SimSequence) -> None:
    """Behind every buffered request of its priority or a higher one (higher first, as the gateway's queue)."""
    if not gateway or gateway[-1].priority >= seq.priority:
        gateway.append(seq)
        return
    at = next(i for i, s in enumerate(gateway) if s.priority < seq.priority)
    gateway.insert(at, seq)


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
