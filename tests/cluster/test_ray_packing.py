"""choose_node: first fit by memory over a region's Ray nodes, a variant spread, CPUs counted, the local words."""

from __future__ import annotations

from tandem.cluster.ray.demand import Demand, NodeView
from tandem.cluster.ray.packing import Holding, choose_node

GiB = 1 << 30
NODES = [
    NodeView("aaaa1111xx", "10.0.0.1", {"region": "eu"}, {"CPU": 2, "memory": 4 * GiB}),
    NodeView("bbbb2222xx", "10.0.0.2", {"region": "eu"}, {"CPU": 8, "memory": 4 * GiB}),
    NodeView("cccc3333xx", "10.0.0.3", {"region": "us"}, {"CPU": 8, "memory": 8 * GiB}),
]


def demand(gib: float, cpus: float = 1, region: str | None = "eu") -> Demand:
    return Demand(cpus=cpus, memory_bytes=int(gib * GiB), region=region)


def test_first_fit_in_the_region_and_a_variants_replicas_spread_first():
    assert choose_node(demand(1), "code", NODES, []) == "aaaa1111xx"
    held = [Holding("aaaa1111xx", demand(1), "code")]
    assert choose_node(demand(1), "code", NODES, held) == "bbbb2222xx"  # no code there yet
    assert choose_node(demand(1), "chat", NODES, held) == "aaaa1111xx"  # another model packs beside it
    assert choose_node(demand(1, region=None), "chat", NODES, held) == "aaaa1111xx"


def test_cpus_taken_by_tandems_replicas_count_too():
    held = [Holding("aaaa1111xx", demand(1, cpus=2), "a")]
    assert choose_node(demand(1, cpus=1), "b", NODES, held) == "bbbb2222xx"
    full = held + [Holding("bbbb2222xx", demand(1, cpus=8), "c")]
    waiting = choose_node(demand(1, cpus=1), "b", NODES, full)
    assert waiting.cause == "no-room" and "CPU 1" in waiting.detail  # said as Ray counts CPUs


def test_reasons_say_the_bytes_as_the_local_backend_does():
    held = [Holding("aaaa1111xx", demand(3), "a"), Holding("bbbb2222xx", demand(3.5), "a")]
    waiting = choose_node(demand(2), "b", NODES, held)
    assert waiting.reason == "no room: needs 2.00 GiB, free 1.00 GiB on node aaaa1111 (the most free on any of 2 nodes)"
    too_large = choose_node(demand(6), "b", NODES, [])
    assert (
        too_large.reason
        == "too large: needs 6.00 GiB, more than any node holds (the largest budget is 4.00 GiB, node aaaa1111)"
    )
    assert choose_node(demand(1, region="ap"), "b", NODES, []).cause == "no-node-in-region"
    assert choose_node(demand(1, cpus=16), "b", NODES, []).cause == "too-large"
