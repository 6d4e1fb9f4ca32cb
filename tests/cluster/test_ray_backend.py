"""RayBackend's bookkeeping with a FakePlacer, a fake probe and a fake clock (no Ray, no processes).

The same Backend contract as LocalBackend: STARTING -> READY on the probe, drains, SIGTERM then
SIGKILL after the grace, every end reported once by exits(); plus what only a cluster has: a
replica placed nowhere yet carries the reason, and a lost actor or node is an unexpected end.
"""

from __future__ import annotations

import pytest

from tandem.cluster import Backend, BackendError, ReplicaSpec, ReplicaState
from tandem.cluster.ray import FakePlacer, NodeView, RayBackend


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


GiB = 1 << 30
NODES = [
    NodeView("aaaa1111", "10.0.0.1", {"region": "eu"}, {"CPU": 2, "memory": 2 * GiB}, {"CPU": 0, "memory": 0.5 * GiB}),
    NodeView("bbbb2222", "10.0.0.2", {"region": "us"}, {"CPU": 2, "memory": 4 * GiB}, {"CPU": 1, "memory": 3 * GiB}),
]


class World:
    def __init__(self, nodes=NODES, waiting=()) -> None:
        self.clock = Clock()
        self.placer = FakePlacer(nodes, waiting)
        self.ready: set[str] = set()  # URLs whose probe answers
        self.backend = RayBackend(self.placer, probe=lambda url: url in self.ready, clock=self.clock, kill_after_s=40)


def spec(region: str = "local", memory: int = GiB, threads: int = 1, variant: str = "fast") -> ReplicaSpec:
    return ReplicaSpec(variant=variant, recipe="int8", region=region, threads=threads, memory_bytes=memory)


def test_a_replica_goes_starting_placed_ready_and_its_demand_is_the_spec():
    w = World()
    assert isinstance(w.backend, Backend)
    replica = w.backend.start(spec(region="eu", memory=2 * GiB, threads=2))
    assert replica.state is ReplicaState.STARTING and replica.url == "" and replica.replica_id == "fast-1"
    actor = w.placer.actors["fast-1"]
    assert (actor.demand.cpus, actor.demand.memory_bytes, actor.demand.region) == (2.0, 2 * GiB, "eu")
    assert actor.node_id == "aaaa1111"  # tandem placed it by memory: pinned to the eu node
    assert w.backend.health("fast-1") is False  # not placed: nothing to probe
    placement = w.placer.launch("fast-1", port=9100)
    assert w.backend.exits() == []  # refresh: the address is known now
    (listed,) = w.backend.list()
    assert listed.url == "http://10.0.0.1:9100" and listed.node == "aaaa1111" and listed.pending is None
    assert w.backend.placement("fast-1") == placement
    assert w.backend.health("fast-1") is False  # loading
    w.ready.add(listed.url)
    assert w.backend.health("fast-1") is True
    assert w.backend.list()[0].state is ReplicaState.READY


def test_the_local_region_places_anywhere_and_others_by_label():
    w = World()
    w.backend.start(spec(region="local"))
    w.backend.start(spec(region="us"))
    assert w.placer.actors["fast-1"].demand.region is None
    assert w.placer.actors["fast-2"].demand.region == "us"


def test_a_replica_too_large_for_any_node_is_pending_with_the_reason_at_once():
    w = World()
    w.backend.start(spec(memory=8 * GiB))
    w.backend.exits()
    (replica,) = w.backend.list()
    assert replica.state is ReplicaState.STARTING and replica.pending is not None
    assert replica.pending.reason == (
        "too large: needs 8.00 GiB, more than any node holds (the largest budget is 4.00 GiB, node bbbb2222)"
    )
    assert "fast-1" not in w.placer.actors  # nothing asked of Ray for it
    # The cluster grew (an autoscaler added a node): placed after all, on that node.
    w.placer.node_views.append(NodeView("cccc3333", "10.0.0.3", {}, {"CPU": 4, "memory": 16 * GiB}))
    w.backend.exits()
    assert w.backend.list()[0].pending is None and w.placer.actors["fast-1"].node_id == "cccc3333"


def test_a_region_no_node_carries_is_pending_naming_the_labels_there_are():
    w = World()
    w.backend.start(spec(region="ap"))
    w.backend.exits()
    pending = w.backend.list()[0].pending
    assert pending.cause == "no-node-in-region"
    assert pending.detail == "no alive node has the label region=ap (nodes are labelled region=eu, region=us)"


def test_a_replica_that_fits_is_pending_only_while_ray_lists_it_waiting():
    w = World()
    w.backend.start(spec(region="eu"))  # fits the eu node's total, not what it has free now
    w.backend.exits()
    assert w.backend.list()[0].pending is None  # Ray is placing it (its worker may be starting)
    w.placer.waiting_shapes = [{"CPU": 1.0, "memory": float(GiB)}]
    w.backend.exits()
    pending = w.backend.list()[0].pending
    assert pending.cause == "no-room"
    assert pending.detail == (
        "waiting for room: it needs CPU 1, memory 1.00 GiB; free now in region eu: node aaaa1111: CPU 0, "
        "memory 0.50 GiB"
    )


def test_without_rays_pending_demands_an_unplaced_replica_is_taken_as_waiting_after_a_while():
    w = World(waiting=None)
    w.backend.start(spec(region="eu"))
    w.backend.exits()
    assert w.backend.list()[0].pending is None
    w.clock.now = 11.0
    w.backend.exits()
    assert w.backend.list()[0].pending.cause == "no-room"


def test_stop_sends_sigterm_and_the_exit_is_reported_once_as_expected_then_the_actor_is_released():
    w = World()
    w.backend.start(spec())
    w.placer.launch("fast-1")
    w.backend.exits()
    w.backend.drain("fast-1")
    assert w.backend.list()[0].state is ReplicaState.DRAINING
    w.backend.stop("fast-1")
    assert w.backend.list() == [] and w.backend.stopping == ["fast-1"]
    assert ("terminate", "fast-1") in w.placer.calls
    w.placer.exit("fast-1", 0)
    (ended,) = w.backend.exits()
    assert ended.expected and ended.code == 0 and ended.replica.replica_id == "fast-1"
    assert ("release", "fast-1") in w.placer.calls and "fast-1" not in w.placer.actors
    assert w.backend.exits() == [] and w.backend.stopping == []


def test_a_server_that_outlives_its_grace_is_killed_once():
    w = World()
    w.backend.start(spec())
    w.placer.launch("fast-1")
    w.backend.exits()
    w.backend.stop("fast-1")
    w.clock.now = 39.0
    w.backend.exits()
    assert ("kill", "fast-1") not in w.placer.calls
    w.clock.now = 41.0
    w.backend.exits()
    w.backend.exits()
    assert w.placer.calls.count(("kill", "fast-1")) == 1


def test_stopping_a_replica_never_placed_drops_its_request_at_once():
    w = World()
    w.backend.start(spec(memory=8 * GiB))
    w.backend.stop("fast-1")
    assert ("release", "fast-1") in w.placer.calls and ("terminate", "fast-1") not in w.placer.calls
    (ended,) = w.backend.exits()
    assert ended.expected and ended.code is None and w.backend.list() == []


def test_a_lost_node_ends_its_replicas_unexpectedly_with_rays_reason():
    w = World()
    for _ in range(3):
        w.backend.start(spec())
    w.placer.launch("fast-1", node_id="aaaa1111")
    w.placer.launch("fast-2", node_id="bbbb2222")
    w.placer.launch("fast-3", node_id="aaaa1111", port=9001)
    w.backend.exits()
    assert sorted(w.placer.lose_node("aaaa1111")) == ["fast-1", "fast-3"]
    ended = w.backend.exits()
    assert sorted(e.replica.replica_id for e in ended) == ["fast-1", "fast-3"]
    assert all(not e.expected and e.code is None for e in ended)
    assert ended[0].error == "ActorDiedError: the actor is dead because its node has died. Node ID: aaaa1111"
    assert [r.replica_id for r in w.backend.list()] == ["fast-2"]
    assert [r.replica_id for r in w.backend.exited] == ["fast-1", "fast-3"]


def test_a_server_that_exits_on_its_own_is_an_unexpected_end_with_its_output():
    w = World()
    w.backend.start(spec())
    w.placer.launch("fast-1")
    w.backend.exits()
    w.placer.exit("fast-1", 1, "loading...\nValueError: bad parameter for optimizer 'speculative'\n")
    (ended,) = w.backend.exits()
    assert not ended.expected and ended.code == 1 and ended.replica.state is ReplicaState.STARTING
    assert ended.error == "ValueError: bad parameter for optimizer 'speculative'"


def test_an_actor_that_dies_before_it_was_placed_is_a_failed_start():
    w = World()
    w.backend.start(spec())
    w.placer.lose("fast-1", "RayActorError: the actor died before it ran: worker startup failed")
    (ended,) = w.backend.exits()
    assert not ended.expected and ended.replica.state is ReplicaState.STARTING
    assert "worker startup failed" in ended.error


def test_ray_refusing_the_request_is_a_backend_error_and_unknown_ids_too():
    w = World()

    def refuse(*_args, **_options):
        raise ValueError("Invalid resource name 'memory': negative")

    w.placer.place = refuse
    with pytest.raises(BackendError, match="cannot start replica fast-1 on Ray: Invalid resource"):
        w.backend.start(spec())
    with pytest.raises(BackendError, match="no replica 'nope'"):
        w.backend.drain("nope")
    w.backend.stop("nope")  # stopping a replica already gone is no error


def test_ids_are_unique_per_backend_and_list_is_oldest_first():
    w = World()
    for variant in ("fast", "slow", "fast"):
        w.clock.now += 1
        w.backend.start(spec(variant=variant))
    assert [r.replica_id for r in w.backend.list()] == ["fast-1", "slow-2", "fast-3"]


def controller(world: World, variant: dict, **controller_config):
    from tandem.deployment import parse_deployment
    from tandem.schedule.controller import Controller

    raw = {"variants": [variant], "policy": {"name": "hpa"}, "controller": controller_config}
    deployment = parse_deployment(raw)
    return Controller(world.backend, deployment.pools(), world.clock, lambda replicas: {}, config=deployment.controller)


def test_the_unchanged_controller_replaces_replicas_lost_with_their_node():
    w = World()
    ctl = controller(w, {"name": "fast", "recipe": "int8", "replicas": {"min": 2, "max": 2}})
    assert len(ctl.tick().started) == 2
    w.placer.launch("fast-1", node_id="aaaa1111", port=9001)
    w.placer.launch("fast-2", node_id="bbbb2222", port=9002)
    w.ready |= {"http://10.0.0.1:9001", "http://10.0.0.1:9002"}
    ctl.tick()
    ctl.tick()
    assert [r.state for r in w.backend.list()] == [ReplicaState.READY, ReplicaState.READY]
    w.placer.lose_node("aaaa1111")
    report = ctl.tick()
    assert [e.replica.replica_id for e in report.exited] == ["fast-1"] and not report.exited[0].expected
    assert "its node has died" in ctl.recent_exits[-1].error
    assert report.started == ["fast-3"]  # the policy wants 2: a replacement, wherever Ray places it


def test_a_replica_pending_past_the_start_timeout_is_a_failed_start_that_says_why():
    w = World()
    big = {"name": "big", "recipe": "int8", "resources": {"memory": "8GiB"}}
    ctl = controller(w, big, start_timeout_s=60, restart_backoff_s=5)
    ctl.tick()  # no node is large enough: it waits, Ray not asked
    ctl.tick()
    assert w.backend.list()[0].pending.cause == "too-large"
    assert ctl.snapshot().replicas[0].pending.cause == "too-large"  # the controller's own view
    w.clock.now = 61.0
    report = ctl.tick()
    assert report.stopped == ["big-1"] and ("release", "big-1") in w.placer.calls
    history = ctl.starts["big"]
    assert history.failures == 1
    assert history.last_error.startswith("not ready after 61 s; stopped (pending (too-large): needs 8.00 GiB, more")


MiB = 1 << 20
THREE = [  # three nodes of one region, as a test cluster has them (Ray's `memory`: its accounting)
    NodeView("head0000", "10.0.0.1", {}, {"CPU": 4, "memory": 2 * GiB}, {"CPU": 4, "memory": 2 * GiB}),
    NodeView("node1111", "10.0.0.2", {}, {"CPU": 4, "memory": 2 * GiB}, {"CPU": 4, "memory": 2 * GiB}),
    NodeView("node2222", "10.0.0.3", {}, {"CPU": 4, "memory": 1 * GiB}, {"CPU": 4, "memory": 1 * GiB}),
]


def test_two_models_pack_by_memory_a_variant_spreads_and_one_that_fits_nowhere_waits_then_is_placed():
    w = World(THREE)
    code = [w.backend.start(spec(memory=1200 * MiB, variant="code")) for _ in range(2)]
    chat = [w.backend.start(spec(memory=700 * MiB, variant="chat")) for _ in range(3)]
    pinned = {rid: a.node_id for rid, a in w.placer.actors.items()}
    # code spreads over the two large nodes; chat goes first where no chat is and room is left.
    assert [pinned[r.replica_id] for r in code] == ["head0000", "node1111"]
    assert [pinned[r.replica_id] for r in chat] == ["head0000", "node1111", "node2222"]
    waiting = w.backend.start(spec(memory=900 * MiB, variant="code"))
    assert waiting.replica_id not in w.placer.actors
    assert (
        waiting.pending.reason
        == "no room: needs 900 MiB, free 324 MiB on node node2222 (the most free on any of 3 nodes)"
    )
    # A chat replica stops: its node's memory is free once its actor has ended, and the waiting one goes there.
    w.placer.launch(chat[2].replica_id)
    w.backend.exits()
    w.backend.stop(chat[2].replica_id)
    w.backend.exits()
    assert waiting.replica_id not in w.placer.actors  # still stopping: it holds its memory
    w.placer.exit(chat[2].replica_id, 0)
    w.backend.exits()
    assert w.placer.actors[waiting.replica_id].node_id == "node2222"
    assert next(r for r in w.backend.list() if r.replica_id == waiting.replica_id).pending is None
    room = {r.name: r.used_bytes for r in w.backend.room()}
    assert room == {"head0000": 1900 * MiB, "node1111": 1900 * MiB, "node2222": 900 * MiB}


def test_replicas_without_a_memory_figure_are_left_to_rays_spread():
    w = World(THREE)
    w.backend.start(spec(memory=0))
    assert w.placer.actors["fast-1"].node_id is None
