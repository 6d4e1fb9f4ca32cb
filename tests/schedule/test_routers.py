"""Routers: least-outstanding, power-of-two, region-aware spill-over, prefix affinity."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tandem.contracts import ReplicaLoad
from tandem.schedule.routers import (
    LeastOutstanding,
    PowerOfTwo,
    PrefixAffinity,
    RegionAware,
    RouteRequest,
    make_router,
)


def load(rid: str, running: int = 0, region: str = "us", healthy: bool = True, kv: float = 0.0, waiting: int = 0):
    return ReplicaLoad(rid, region, "v", running=running, waiting=waiting, kv_used=kv, healthy=healthy)


def test_least_outstanding_counts_running_and_waiting_and_skips_unhealthy_and_excluded():
    replicas = [load("a", 3), load("b", 1, waiting=3), load("c", 2), load("d", 0, healthy=False)]
    router = LeastOutstanding()
    assert router.choose(RouteRequest(), replicas).replica_id == "c"
    assert router.choose(RouteRequest(exclude=frozenset({"c"})), replicas).replica_id == "a"
    assert router.choose(RouteRequest(), [load("x", healthy=False)]) is None
    assert router.choose(RouteRequest(), []) is None


def test_least_outstanding_ties_break_on_kv_then_id():
    assert LeastOutstanding().choose(RouteRequest(), [load("b"), load("a")]).replica_id == "a"
    assert LeastOutstanding().choose(RouteRequest(), [load("a", kv=0.5), load("b", kv=0.1)]).replica_id == "b"


def test_power_of_two_picks_the_lighter_of_two_random_replicas():
    replicas = [load(f"r{i}", running=i) for i in range(10)]
    router = PowerOfTwo(random.Random(0))
    picks = Counter(router.choose(RouteRequest(), replicas).replica_id for _ in range(2000))
    assert "r9" not in picks  # the busiest always loses its duel
    # P(pick r_i) = 2 (9 - i) / 90: r0 gets 20%, r8 2%.
    assert picks["r0"] / 2000 == pytest.approx(0.2, abs=0.03)
    assert picks["r0"] > picks["r4"] > picks["r8"]


def test_power_of_two_with_two_or_fewer_is_least_loaded():
    assert PowerOfTwo(random.Random(0)).choose(RouteRequest(), [load("a", 5), load("b", 1)]).replica_id == "b"


def test_region_aware_prefers_home_and_spills_when_home_is_saturated():
    router = RegionAware(saturation=4)
    replicas = [load("us1", 3, "us"), load("us2", 2, "us"), load("eu1", 0, "eu")]
    assert router.choose(RouteRequest(region="us"), replicas).replica_id == "us2"  # home, though eu is idler
    saturated = [load("us1", 4, "us"), load("us2", 5, "us"), load("eu1", 1, "eu"), load("eu2", 0, "eu")]
    assert router.choose(RouteRequest(region="us"), saturated).replica_id == "eu2"  # spill over
    everyone_busy = [load("us1", 9, "us"), load("eu1", 4, "eu")]
    assert router.choose(RouteRequest(region="us"), everyone_busy).replica_id == "us1"  # queue at home
    assert router.choose(RouteRequest(region="ap"), replicas).replica_id == "eu1"  # no home replicas
    kv_full = [load("us1", 0, "us", kv=0.97), load("eu1", 2, "eu")]
    assert router.choose(RouteRequest(region="us"), kv_full).replica_id == "eu1"


def test_prefix_affinity_is_sticky_and_moves_little_when_replicas_change():
    router = PrefixAffinity(block_chars=24)  # "system prompt #NNN and t": the question is past the block
    replicas = [load(f"r{i}") for i in range(4)]
    prompts = [f"system prompt #{i:03d} and then the user's own question {j}" for i in range(200) for j in range(2)]
    first = {p: router.choose(RouteRequest(prefix=p), replicas).replica_id for p in prompts}
    # Same first block -> same replica (the j suffix is past the block).
    for i in range(200):
        assert first[prompts[2 * i]] == first[prompts[2 * i + 1]]
    assert len(set(first.values())) == 4
    # Adding a fifth replica moves only the prefixes it now wins (about a fifth).
    grown = replicas + [load("r4")]
    moved = [p for p in prompts if router.choose(RouteRequest(prefix=p), grown).replica_id != first[p]]
    assert all(router.choose(RouteRequest(prefix=p), grown).replica_id == "r4" for p in moved)
    assert 0.1 < len(moved) / len(prompts) < 0.32


def test_prefix_affinity_goes_least_loaded_when_imbalanced():
    router = PrefixAffinity(block_chars=16, balance_abs=4, balance_rel=1.5)
    replicas = [load("r0"), load("r1"), load("r2")]
    home = router.choose(RouteRequest(prefix="shared prefix here"), replicas).replica_id
    busy = [load(r.replica_id, running=(10 if r.replica_id == home else 1)) for r in replicas]
    assert router.choose(RouteRequest(prefix="shared prefix here"), busy).replica_id != home
    mild = [load(r.replica_id, running=(4 if r.replica_id == home else 1)) for r in replicas]
    assert router.choose(RouteRequest(prefix="shared prefix here"), mild).replica_id == home  # gap 3 <= 4
    assert router.choose(RouteRequest(prefix=""), busy).replica_id != home  # no prefix: least loaded


def test_make_router_by_name():
    assert isinstance(make_router("least-outstanding"), LeastOutstanding)
    assert isinstance(make_router("power-of-two", random.Random(1)), PowerOfTwo)
    assert isinstance(make_router("region-aware", saturation=2), RegionAware)
    assert isinstance(make_router("prefix-affinity", block_chars=8), PrefixAffinity)
    with pytest.raises(ValueError, match="unknown router"):
        make_router("round-robin")


def test_admission_cap_leaves_full_replicas_alone_and_queues_when_all_are_full():
    from tandem.schedule.routers import AdmissionCap

    cap = [3]
    router = AdmissionCap(LeastOutstanding(), lambda: cap[0])
    replicas = [ReplicaLoad("a", "local", "v", 3, 0, 0.0, True), ReplicaLoad("b", "local", "v", 2, 0, 0.0, True)]
    assert router.choose(RouteRequest(), replicas).replica_id == "b"
    full = [ReplicaLoad("a", "local", "v", 3, 0, 0.0, True), ReplicaLoad("b", "local", "v", 2, 1, 0.0, True)]
    assert router.choose(RouteRequest(), full) is None  # the request waits at the gateway
    cap[0] = None  # no cap known yet: the inner router alone
    assert router.choose(RouteRequest(), full).replica_id == "a"
