"""What a replica asks of a Ray node, and the operator's sentence for why Ray has not placed it."""

from __future__ import annotations

from tandem.cluster import ReplicaSpec
from tandem.cluster.ray import Demand, NodeView, demand_for, pending_placement
from tandem.cluster.ray.demand import describe_resources, waits

GiB = 1 << 30


def test_a_demand_is_the_specs_threads_memory_accelerators_and_region():
    spec = ReplicaSpec("fast", "int8", region="eu", threads=4, memory_bytes=2 * GiB, accelerators=1,
                       accelerator_type="A100")  # fmt: skip
    demand = demand_for(spec)
    assert demand == Demand(cpus=4.0, memory_bytes=2 * GiB, accelerators=1.0, accelerator_type="A100", region="eu")
    assert demand.resources() == {"CPU": 4.0, "memory": 2.0 * GiB, "GPU": 1.0, "accelerator_type:A100": 0.001}


def test_no_threads_is_one_cpu_and_the_local_region_is_any_node_and_nothing_unasked_is_reserved():
    demand = demand_for(ReplicaSpec("fast", None))
    assert demand == Demand(cpus=1.0, region=None)
    assert demand.resources() == {"CPU": 1.0}


def test_waits_matches_rays_pending_demand_by_shape():
    demand = Demand(cpus=1, memory_bytes=GiB)
    assert waits(demand, [{"CPU": 2.0}, {"memory": float(GiB), "CPU": 1.0}])
    assert not waits(demand, [{"CPU": 1.0}])  # another shape (no memory)
    assert not waits(demand, [{"CPU": 1.0, "memory": 2.0 * GiB}])
    assert not waits(demand, [])


NODES = [
    NodeView("aaaa1111", "10.0.0.1", {"region": "eu"}, {"CPU": 4, "memory": 3 * GiB, "GPU": 1},
             {"CPU": 2, "memory": 0.5 * GiB, "GPU": 1}),
    NodeView("bbbb2222", "10.0.0.2", {}, {"CPU": 2, "memory": 8 * GiB}, {"CPU": 2, "memory": 8 * GiB}),
]  # fmt: skip


def test_a_demand_no_node_is_large_enough_for_names_each_resource_short():
    pending = pending_placement(Demand(cpus=8, memory_bytes=4 * GiB, accelerators=2, region="eu"), NODES, False)
    assert pending.cause == "too-large"
    assert pending.detail == (
        "no node in region eu is large enough: it needs CPU 8 (the most any node in region eu has is 4); memory "
        "4.00 GiB (the most any node in region eu has is 3.00 GiB); GPU 2 (the most any node in region eu has is 1)"
    )
    assert str(pending).startswith("pending (too-large): no node in region eu")


def test_a_region_without_nodes_and_a_cluster_without_labels():
    pending = pending_placement(Demand(cpus=1, region="us"), NODES, True)
    assert (pending.cause, pending.detail) == (
        "no-node-in-region",
        "no alive node has the label region=us (nodes are labelled region=eu)",
    )
    bare = pending_placement(Demand(cpus=1, region="us"), NODES[1:], True)
    assert bare.detail == "no alive node has the label region=us (no node has one)"


def test_a_demand_that_fits_is_pending_only_when_ray_says_it_waits_and_shows_what_is_free():
    demand = Demand(cpus=1, memory_bytes=GiB, region="eu")
    assert pending_placement(demand, NODES, waiting=False) is None
    pending = pending_placement(demand, NODES, waiting=True)
    assert pending.cause == "no-room"
    assert pending.detail == (
        "waiting for room: it needs CPU 1, memory 1.00 GiB; free now in region eu: node aaaa1111: CPU 2, "
        "memory 0.50 GiB"
    )
    anywhere = pending_placement(Demand(cpus=1, memory_bytes=GiB), NODES, waiting=True)
    assert "free now: node aaaa1111: CPU 2, memory 0.50 GiB; node bbbb2222: CPU 2, memory 8.00 GiB" in anywhere.detail


def test_describe_resources():
    assert describe_resources({"CPU": 1.5, "memory": 1.5 * GiB}) == "CPU 1.5, memory 1.50 GiB"
    assert describe_resources({}) == "nothing"
