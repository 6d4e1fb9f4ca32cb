"""The kv-aware router: cached prefix tokens against queued work, saturation, and its fall back to load."""

from __future__ import annotations

import pytest

from tandem.contracts import ReplicaLoad
from tandem.schedule.routers import KVAware, LeastOutstanding, PrefixMatch, RouteRequest, make_router


def load(replica_id: str, running: int = 0, waiting: int = 0, kv_used: float = 0.0, healthy: bool = True):
    return ReplicaLoad(replica_id, "r", "v", running, waiting, kv_used, healthy)


def with_kv(prompt: int, cached: dict[str, int]) -> RouteRequest:
    return RouteRequest(kv=PrefixMatch(prompt, cached, frozenset(cached)))


def test_the_replica_holding_the_prefix_wins_while_its_queue_costs_less_than_the_prefill_it_saves():
    router = KVAware(queued_request_tokens=512)
    request = with_kv(4096, {"a": 0, "b": 3072})
    # b saves 3072 prompt tokens: worth up to 6 more requests in its queue (6 x 512)
    assert router.choose(request, [load("a"), load("b", running=5)]).replica_id == "b"
    assert router.choose(request, [load("a"), load("b", running=6)]).replica_id == "a"  # tie on cost: fewer queued
    assert router.choose(request, [load("a"), load("b", running=7)]).replica_id == "a"


def test_a_saturated_holder_is_skipped_while_another_replica_is_open():
    router = KVAware(saturation=4)
    request = with_kv(4096, {"a": 4096, "b": 0})
    assert router.choose(request, [load("a", running=3), load("b")]).replica_id == "a"
    assert router.choose(request, [load("a", running=4), load("b")]).replica_id == "b"
    assert router.choose(request, [load("a", kv_used=0.97), load("b")]).replica_id == "b"
    # everyone saturated: the cost decides among them all
    assert router.choose(request, [load("a", running=4), load("b", running=4)]).replica_id == "a"


def test_without_a_prefix_match_it_is_least_outstanding():
    loads = [load("a", running=3), load("b", running=1, waiting=1), load("c", running=2, kv_used=0.1)]
    for request in (RouteRequest(), with_kv(100, {})):
        assert KVAware().choose(request, loads) == LeastOutstanding().choose(request, loads)


def test_replicas_that_publish_nothing_compete_on_load_alone():
    request = RouteRequest(kv=PrefixMatch(2048, {"a": 2048}, frozenset({"a"})))  # b: an external engine
    assert KVAware().choose(request, [load("a", running=2), load("b")]).replica_id == "a"
    assert KVAware().choose(request, [load("a", running=5), load("b")]).replica_id == "b"


def test_unhealthy_and_excluded_replicas_are_never_chosen():
    request = with_kv(1024, {"a": 1024, "b": 1024})
    assert KVAware().choose(request, [load("a", healthy=False), load("b")]).replica_id == "b"
    excluded = RouteRequest(kv=request.kv, exclude=frozenset({"b"}))
    assert KVAware().choose(excluded, [load("a", healthy=False), load("b")]) is None


def test_made_by_name_with_its_parameters_and_bad_ones_refused():
    router = make_router("kv-aware", queued_request_tokens=100, saturation=8)
    assert isinstance(router, KVAware) and router.queued_request_tokens == 100
    with pytest.raises(ValueError, match="kv-aware"):
        make_router("kv-aware", queued_request_tokens=-1)
    with pytest.raises(ValueError, match="kv-aware"):
        make_router("kv-aware", saturation=0)
