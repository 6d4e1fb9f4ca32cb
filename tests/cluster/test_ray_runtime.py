"""The Ray side without a cluster: how `connect` chooses a cluster and says so, the actor options a
replica's demand becomes, Ray's errors as an operator's line, and that nothing imports Ray unasked."""

from __future__ import annotations

import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tandem.cluster import BackendError
from tandem.cluster.ray import Demand
from tandem.cluster.ray.demand import NodeView
from tandem.cluster.ray.runtime import RayPlacer, connect, describe_cluster, loss_reason

GiB = 1 << 30


def reachable(address: str) -> None:
    return None


class FakeRay:
    """The few `ray` calls connect() and RayPlacer's constructor make."""

    def __init__(self, initialized: bool = False, fail: Exception | None = None) -> None:
        self.initialized = initialized
        self.fail = fail
        self.inits: list[dict] = []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kwargs) -> None:
        if self.fail is not None:
            raise self.fail
        self.inits.append(kwargs)
        self.initialized = True

    def get_runtime_context(self):
        return SimpleNamespace(gcs_address="10.0.0.1:6379")

    def remote(self, cls):
        return cls


def test_an_address_given_wins_and_the_banner_says_it_was_given():
    ray = FakeRay()
    said = connect(
        "10.0.0.1:6379", environ={"RAY_ADDRESS": "elsewhere:1"}, ray=ray, started_here=lambda: "x:1",
        unreachable=reachable,
    )  # fmt: skip
    assert ray.inits == [{"address": "10.0.0.1:6379", "namespace": "tandem", "log_to_driver": False}]
    assert said == "connected to the Ray cluster at 10.0.0.1:6379 (given)"


def test_then_ray_address_then_the_cluster_ray_start_left_on_this_machine():
    ray = FakeRay()
    from_variable = connect(None, {"RAY_ADDRESS": "10.0.0.9:6379"}, ray, lambda: "x:1", reachable)
    assert from_variable.endswith("(RAY_ADDRESS)")
    assert ray.inits[0]["address"] == "10.0.0.9:6379"
    ray = FakeRay()
    said = connect(None, environ={}, ray=ray, started_here=lambda: "10.0.0.2:6379", unreachable=reachable)
    assert ray.inits[0]["address"] == "10.0.0.2:6379"
    assert said == "connected to the Ray cluster at 10.0.0.1:6379 (started on this machine with `ray start`)"


def test_with_no_cluster_anywhere_it_starts_a_local_one_as_ray_init_does():
    ray = FakeRay()
    said = connect(None, environ={}, ray=ray, started_here=lambda: None)
    assert ray.inits[0]["address"] == "local"
    assert said.startswith("started a local Ray cluster at 10.0.0.1:6379")


def test_a_process_already_connected_keeps_its_cluster():
    ray = FakeRay(initialized=True)
    assert connect("elsewhere:1", ray=ray) == "using the Ray cluster this process is connected to (10.0.0.1:6379)"
    assert ray.inits == []


def test_a_cluster_that_cannot_be_reached_is_one_clear_error_at_once():
    ray = FakeRay()
    with pytest.raises(BackendError, match=r"cannot reach the Ray cluster at 10.0.0.1:6379 \(given\): refused"):
        connect("10.0.0.1:6379", environ={}, ray=ray, unreachable=lambda address: "refused")
    assert ray.inits == []  # ray.init() would have retried for ever
    stale = dict(environ={}, ray=ray, started_here=lambda: "10.0.0.2:6379", unreachable=lambda address: "refused")
    with pytest.raises(BackendError, match="at 10.0.0.2:6379 \\(started on this machine with `ray start`\\)"):
        connect(None, **stale)  # the address file of a cluster since stopped
    with pytest.raises(BackendError, match="no Ray cluster to connect to: none was started on this machine"):
        connect("auto", environ={}, ray=ray, started_here=lambda: None)
    failing = FakeRay(fail=ConnectionError("version mismatch"))
    with pytest.raises(BackendError, match=r"cannot connect to the Ray cluster at a:1 \(given\): version mismatch"):
        connect("a:1", environ={}, ray=failing, unreachable=reachable)


def test_reachability_is_a_tcp_connect():
    from tandem.cluster.ray.runtime import _unreachable

    assert _unreachable("not-an-address") == "'not-an-address' is not HOST:PORT"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert _unreachable(f"127.0.0.1:{port}") is None
    assert _unreachable(f"127.0.0.1:{port}") is not None  # closed now: refused


def test_a_replicas_demand_becomes_actor_options_ray_never_restarts_and_spreads():
    placer = RayPlacer(FakeRay())
    options = placer.options(Demand(cpus=2, memory_bytes=3 * GiB, accelerators=1, accelerator_type="A100", region="eu"))
    assert options == {
        "num_cpus": 2, "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 4,
        "runtime_env": {"env_vars": {"RAY_worker_niceness": "0"}}, "memory": 3 * GiB,
        "num_gpus": 1, "accelerator_type": "A100", "label_selector": {"region": "eu"}, "scheduling_strategy": "SPREAD",
    }  # fmt: skip
    plain = RayPlacer(FakeRay(), spread=False).options(Demand(cpus=1))
    assert plain == {
        "num_cpus": 1, "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 4,
        "runtime_env": {"env_vars": {"RAY_worker_niceness": "0"}},
    }  # fmt: skip


def test_rays_error_becomes_one_line_with_the_reason():
    class ActorDiedError(Exception):
        pass

    text = (
        "The actor died unexpectedly before finishing this task.\n\tclass_name: ReplicaHost\n\tpid: 21322\n"
        "The actor died because its node has died. Node Id: 8a1d3488\n\tthe actor's node was terminated unexpectedly"
    )
    reason = "ActorDiedError: The actor died because its node has died. Node Id: 8a1d3488"
    assert loss_reason(ActorDiedError(text)) == reason
    assert loss_reason(ActorDiedError("")) == "ActorDiedError: ActorDiedError"


def test_the_banner_sums_the_nodes_and_names_their_regions():
    nodes = [
        NodeView("a", "10.0.0.1", {"region": "eu"}, {"CPU": 4, "memory": 2 * GiB}),
        NodeView("b", "10.0.0.2", {"region": "us"}, {"CPU": 2, "memory": GiB, "GPU": 1}),
    ]
    assert describe_cluster(nodes) == "2 nodes: CPU 6, memory 3.00 GiB, GPU 1; regions eu, us"
    assert describe_cluster([NodeView("c", "x", {}, {"CPU": 1})]) == "1 node: CPU 1; no node has a region label"


def test_nothing_imports_ray_unless_the_ray_backend_is_used():
    code = (
        "import sys, tandem.cluster.ray, tandem.gateway.cli, tandem.gateway.wiring, tandem.cli\n"
        "assert 'ray' not in sys.modules, sorted(m for m in sys.modules if m.startswith('ray'))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
