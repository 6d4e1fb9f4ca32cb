"""What the simulator shows the router: the ready replicas' loads, kept current between ticks rather than
rebuilt for every replica at every dispatch. Both shortcuts must give exactly what a fresh look would."""

from __future__ import annotations

import functools
import math
import random
from dataclasses import replace

from tandem.contracts import Profile, ReplicaLoad
from tandem.schedule.policies import KpaParams, kpa, kpa_limits
from tandem.schedule.policies.prefill_budget import PrefillBudget
from tandem.schedule.routers import ROUTER_NAMES, AdmissionCap, RouteRequest, make_router
from tandem.schedule.variant import Variant
from tandem.sim import SimConfig, poisson_trace, simulate
from tandem.sim import simulator as simulator_module
from tandem.sim.replica import SimReplica


def random_loads(rng: random.Random, n: int) -> list[ReplicaLoad]:
    return [
        ReplicaLoad(f"r{i}", rng.choice(["eu", "us"]), "v", running=rng.randrange(6), waiting=rng.randrange(3),
                    kv_used=rng.random(), healthy=rng.random() < 0.6, prefill_tokens=rng.choice([0, 0, 300, 900]))
        for i in range(n)
    ]  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fresh(sim: SimReplica) -> tuple[int, int, int]:
    """(running, waiting, prompt tokens to prefill) of a replica, read from its queues now."""
    pending = sum(s.prompt_tokens for s in sim.waiting) + sum(s.prefill_left for s in sim.prefilling)
    return sim.running, len(sim.waiting), math.ceil(pending)


def test_every_router_chooses_the_same_without_the_replicas_that_are_not_ready():
    # The simulator leaves starting and draining replicas out of what it shows a router: every router (and the
    # admission cap around it, with its pace state) must choose exactly as it would with them in the list.
    budget = PrefillBudget(tokens=1000.0, pace_by_rows=(4000.0, 3000.0, 2000.0, 1000.0))
    for name in ROUTER_NAMES:
        for capped in (False, True):
            clock = Clock()
            routers = []
            for _ in range(2):
                inner = make_router(name, random.Random(1))
                routers.append(AdmissionCap(inner, lambda: 5, lambda: budget, clock) if capped else inner)
            rng = random.Random(2)
            for _ in range(300):
                clock.now += rng.random() * 0.2
                loads = random_loads(rng, rng.randrange(1, 9))
                request = RouteRequest(region=rng.choice([None, "eu"]), prefix=str(rng.randrange(4)),
                                       prompt_tokens=rng.choice([100, 600]))  # fmt: skip
                full = routers[0].choose(request, loads)
                ready = routers[1].choose(request, [r for r in loads if r.healthy])
                assert full == ready, (name, capped)


def test_the_loads_a_router_is_shown_are_those_of_the_replicas_right_now(monkeypatch):
    # A burst under kpa (replicas starting and draining) with the admission cap (a queue at the gateway, routed
    # several times a step): at every choice each load shown equals a fresh reading of its replica.
    sims: dict[str, SimReplica] = {}
    seen = {"calls": 0, "loads": 0}

    class Recorded(SimReplica):
        def __init__(self, replica_id, *args, **kwargs):
            super().__init__(replica_id, *args, **kwargs)
            sims[replica_id] = self

    class Checked(AdmissionCap):
        def choose(self, request, replicas):
            seen["calls"] += 1
            for load in replicas:
                sim = sims[load.replica_id]
                assert load.healthy
                assert (load.running, load.waiting, load.prefill_tokens) == fresh(sim)
                seen["loads"] += 1
            return super().choose(request, replicas)

    monkeypatch.setattr(simulator_module, "SimReplica", Recorded)
    monkeypatch.setattr(simulator_module, "AdmissionCap", Checked)
    profile = Profile(
        recipe="r", hardware="h", model="m", weight_bytes=1, kv_bytes_per_token=1, max_slots=16,
        decode_tokens_per_s={1: 50.0, 8: 320.0, 16: 480.0}, prefill_tokens_per_s=8000.0, ttft_s_p50=0.1,
        cold_start_s=20.0,
    )  # fmt: skip
    base = poisson_trace(2.0, 200, prompt=800, output=60, seed=1)
    trace = sorted(base + poisson_trace(25.0, 20, prompt=800, output=60, seed=2, start_s=60), key=lambda r: r.arrival_s)
    config = replace(SimConfig(), ttft_slo_s=2.0, tpot_slo_s=0.05, warmup_s=0, tail_s=300, admission_cap=True)
    policy = functools.partial(kpa, params=KpaParams(target_concurrency=8, target_utilization=0.7))
    result = simulate(trace, Variant("v", "r", profile=profile), policy, kpa_limits(1, 12), config=config)
    assert result.max_buffered > 0 and result.peak >= 3 and result.lost == 0 and result.unserved == 0
    assert seen["calls"] > len(trace) and seen["loads"] > seen["calls"]
