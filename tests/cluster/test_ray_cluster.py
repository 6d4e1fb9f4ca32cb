"""The Ray backend on a real multi-node Ray cluster on this machine, through the real gateway.

One cluster for the module (`ray.cluster_utils.Cluster`: a head and two nodes with different CPUs,
memory and region labels, see NODES), real replicas (`tandem serve` on the tiny model, one thread
each) launched by Ray actors on their nodes, and the gateway in this process routing to them over
HTTP as it does to local ones. Memory is Ray's logical resource: the variants' Profiles and
`resources.memory` decide what fits where, not what the tiny model really uses.

The node-loss test removes a node, so it comes last.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway.harness import MODEL_NAME, REPLICA_ARGS, Load, RunningGateway, metric, wait_for
from metrics_text import scrape, total
from server_process import ServerProcess
from tiny_models import save_tiny

from tandem.cluster import ReplicaSpec
from tandem.cluster.external import ExternalEngine
from tandem.cluster.ray import RayBackend
from tandem.cluster.ray.runtime import RayPlacer
from tandem.edge.settings import settings_variables
from tandem.gateway.wiring import FLEET_SECRET_ENV, new_fleet_secret
from tandem.schedule.rollout import Phase
from tandem.schedule.variant import REPLICA_RUNTIME_BYTES

pytestmark = [pytest.mark.ray, pytest.mark.slow]

GiB = 1 << 30
MiB = 1 << 20
NODES = {  # name -> ray.cluster_utils node arguments; CPUs and memory are Ray's accounting only
    "head": {"num_cpus": 3, "memory": 3 * GiB, "labels": {"region": "us"}},
    "eu": {"num_cpus": 4, "memory": 3 * GiB, "labels": {"region": "eu"}},
    "us-2": {"num_cpus": 2, "memory": 2 * GiB, "labels": {"region": "us"}},
}
# A node is declared dead after 10 missed health checks of 1 s (Ray's default: 5 of 3 s), so a
# removed node's actors are reported in seconds; 10 keeps a raylet starved by a busy machine alive.
FAST_NODE_DEATH = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 3000,
    "health_check_failure_threshold": 10,
}
TICK = 0.5


class RayCluster:
    def __init__(self, cluster: Any, nodes: dict[str, Any]) -> None:
        self.cluster = cluster
        self.nodes = nodes  # name -> ray._private.node.Node

    def node_id(self, name: str) -> str:
        return self.nodes[name].node_id

    def name_of(self, node_id: str) -> str:
        return next(name for name, node in self.nodes.items() if node.node_id == node_id)


@pytest.fixture(scope="module")
def ray_cluster() -> Any:
    import ray
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 80 * MiB}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**NODES["head"], **small, "include_dashboard": False, "_system_config": FAST_NODE_DEATH},
    )
    nodes = {"head": cluster.head_node}
    try:
        for name in ("eu", "us-2"):  # both start at once; then wait for the three
            nodes[name] = cluster.add_node(wait=False, **NODES[name], **small)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="tandem", log_to_driver=False)
        yield RayCluster(cluster, nodes)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("ray") / "tiny-serve", max_position_embeddings=1024)


def profile(memory_bytes: int) -> dict[str, Any]:
    """An inline Profile whose replicas need `memory_bytes` (weights + 32768 tokens of KV + runtime)."""
    kv_bytes_per_token = 8192
    weights = memory_bytes - 32768 * kv_bytes_per_token - REPLICA_RUNTIME_BYTES
    assert weights > 0
    return {
        "recipe": "baseline", "hardware": "test", "model": "tiny", "weight_bytes": weights,
        "kv_bytes_per_token": kv_bytes_per_token, "max_slots": 8, "decode_tokens_per_s": {"1": 100.0, "8": 400.0},
        "prefill_tokens_per_s": 1000.0, "ttft_s_p50": 0.05, "cold_start_s": 5.0,
    }  # fmt: skip


def variant(name: str, lo: int = 1, hi: int = 1, recipe: str = "baseline", **more: Any) -> dict[str, Any]:
    return {"name": name, "recipe": recipe, "replicas": {"min": lo, "max": hi}, "args": REPLICA_ARGS, **more}


def deployment(model_dir: Path, variants: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {
        "model": str(model_dir),
        "threads": 1,
        "variants": variants,
        "policy": {"name": "hpa", "interval_s": TICK, "params": {"target": 100}},
        "controller": {"drain_timeout_s": 30},
        "backend": {"name": "ray"},
        **more,
    }


def gateway(raw: dict[str, Any], tmp_path: Path, **options: Any) -> RunningGateway:
    secret = new_fleet_secret()  # replicas on every node answer only this gateway
    placer = RayPlacer(
        log_dir=str(tmp_path / "replicas"), unset_env=settings_variables(), extra_env={FLEET_SECRET_ENV: secret}
    )
    backend = RayBackend(placer, kill_after_s=20.0)
    return RunningGateway(raw, tmp_path / "gateway", backend=backend, fleet_secret=secret, **options)


def nodes_of(gw: RunningGateway, variant: str | None = None) -> list[str]:
    return [r.node for r in gw.backend.list() if r.node and (variant is None or r.variant == variant)]


def served_by(url: str, secret: str) -> float:
    """Requests a replica finished (its own /metrics, which answers only its gateway's secret)."""
    return total(scrape(url, secret), "tandem:request_success_total")


def completion(url: str, headers: dict[str, str] | None = None, max_tokens: int = 4) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": "def f(", "max_tokens": max_tokens}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60)


def test_a_burst_scales_one_to_three_replicas_spread_over_the_nodes_and_back(ray_cluster, model_dir, tmp_path):
    raw = deployment(
        model_dir,
        [variant("fast", lo=1, hi=3, profile=profile(GiB))],
        policy={
            "name": "hpa",
            "interval_s": TICK,
            "params": {"target": 2, "scale_down_stabilization_s": 3},
            "limits": {"max_scale_down_rate": 10},
        },
    )
    gw = gateway(raw, tmp_path)
    try:
        gw.wait_ready("fast", timeout=180)
        assert completion(gw.url).status_code == 200
        load = Load(gw.url, workers=8, stream=lambda n: n % 2 == 0, max_tokens=48)
        try:
            gw.wait_ready("fast", count=3, timeout=180)
            spread = sorted(ray_cluster.name_of(node) for node in nodes_of(gw, "fast"))
            pids = [gw.backend.placement(r.replica_id).pid for r in gw.backend.list()]
            # Served at the node's normal priority (this test's own: the nodes are its children; 0 unless
            # the suite runs under `nice`), not Ray's worker niceness (15) that the server would inherit.
            own = os.getpriority(os.PRIO_PROCESS, 0)
            assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [own] * 3
            wait_for(lambda: load.outcomes.ok >= 16, 60, "requests served by the grown fleet")
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [] and outcomes.broken_mid_stream == []
        assert spread == ["eu", "head", "us-2"]  # Ray's SPREAD: one replica per node while each has room
        gw.settled()
        wait_for(lambda: len(gw.backend.list()) == 1 and not gw.backend.stopping, 90, "the fleet to shrink to one")
        text = gw.metrics()
        assert metric(text, "tandem:scale_decisions_total", policy="hpa", direction="up") >= 1
        assert metric(text, "tandem:scale_decisions_total", policy="hpa", direction="down") >= 1
        assert all(r.exit_code == 0 for r in gw.backend.exited)  # drained, then SIGTERM: clean exits
        assert gw.errors() == 0
    finally:
        gw.stop()


def test_variants_pack_as_memory_allows_and_one_too_large_for_any_node_is_pending(ray_cluster, model_dir, tmp_path):
    # All three want the eu node (3 GiB, 4 CPUs): two `small` (1 GiB each, from their Profile) and a
    # `medium` (1.5 GiB) need 3.5 GiB, so the two `small` are placed there and `medium` waits; `big`
    # (5 GiB) fits no node at all.
    raw = deployment(
        model_dir,
        [
            variant("small", lo=2, hi=2, profile=profile(GiB)),
            variant("medium", profile=profile(3 * GiB // 2)),
            variant("big", resources={"memory": "5GiB"}),
        ],
        regions=["eu"],
    )
    gw = gateway(raw, tmp_path)
    try:
        eu = ray_cluster.node_id("eu")

        def settled() -> bool:
            fleet = gw.backend.list()
            return len(fleet) == 4 and sum(1 for r in fleet if r.node) == 2 and sum(bool(r.pending) for r in fleet) == 2

        wait_for(settled, 120, "two replicas placed and two pending")
        placed = [r for r in gw.backend.list() if r.node]
        assert {r.node for r in placed} == {eu}  # several replicas share the node its memory allows
        assert sum(r.spec.memory_bytes for r in placed) <= NODES["eu"]["memory"]
        waiting = next(r for r in gw.backend.list() if r.pending and r.variant != "big")
        assert waiting.variant == "medium"
        assert waiting.pending.reason == f"no room: needs 1.50 GiB, free 1.00 GiB on node {eu[:8]}"
        (big,) = [r for r in gw.backend.list() if r.variant == "big"]
        assert big.pending.cause == "too-large" and big.state == "starting"
        assert big.pending.detail == (
            f"needs 5.00 GiB, more than any node holds (the largest budget is 3.00 GiB, node {eu[:8]})"
        )
        for r in placed:
            gw.wait_ready(r.variant, timeout=180)
        assert completion(gw.url).status_code == 200  # a `small` is among the placed: the primary serves

        # What an operator sees: GET /admin/replicas and /metrics (the gateway is never blocked meanwhile).
        view = httpx.get(gw.url + "/admin/replicas", timeout=10).json()["replicas"]
        shown = {r["id"]: r for r in view}
        assert shown[big.replica_id]["pending"] == {"cause": "too-large", "detail": big.pending.detail}
        assert shown[big.replica_id]["state"] == "starting" and shown[big.replica_id]["node"] is None
        assert all(shown[r.replica_id]["node"] == eu and shown[r.replica_id]["pending"] is None for r in placed)
        text = gw.metrics()
        assert metric(text, "tandem:replicas_pending", variant="big", cause="too-large") == 1
        assert metric(text, "tandem:replicas_pending", variant=waiting.variant, cause="no-room") == 1
        assert {r.replica_id for r in gw.gw.fleet.controller.snapshot().replicas if r.pending} == {
            big.replica_id,
            waiting.replica_id,
        }  # the controller's own view
    finally:
        gw.stop()


def test_two_models_are_placed_by_memory_over_three_nodes_and_one_that_fits_none_waits_until_room_frees(
    ray_cluster, tmp_path
):
    """Two models' replicas (stand-in servers, tests/fake_openai_server.py: cheap processes) straight
    on RayBackend: `code` (1.5 GiB a replica) spreads one per node; `chat` (1.25 GiB) fits only beside
    it on the two 3 GiB nodes; a third `chat` fits nowhere and waits, with the reason, until one of
    the others is stopped and its memory freed."""
    fake = str(Path(__file__).parents[1] / "fake_openai_server.py")
    argv = (sys.executable, fake, "--host", "{host}", "--port", "{port}", "--served-model-name", "{served_model_name}")

    def spec(model: str, memory: int) -> ReplicaSpec:
        return ReplicaSpec(variant=model, recipe=None, model=model, memory_bytes=memory, engine=ExternalEngine(argv))

    backend = RayBackend(RayPlacer(log_dir=str(tmp_path / "replicas")), kill_after_s=10.0)
    try:
        code = [backend.start(spec("code", 3 * GiB // 2)) for _ in range(3)]
        chat = [backend.start(spec("chat", 5 * GiB // 4)) for _ in range(3)]
        assert [r.pending for r in code + chat[:2]] == [None] * 5
        waiting = chat[2]
        us2 = ray_cluster.node_id("us-2")
        assert waiting.pending.reason == (
            f"no room: needs 1.25 GiB, free 512 MiB on node {us2[:8]} (the most free on any of 3 nodes)"
        )

        def placed() -> dict[str, Any]:
            backend.exits()
            return {r.replica_id: r for r in backend.list() if r.node}

        wait_for(lambda: len(placed()) == 5, 120, "five replicas placed")
        where = {rid: ray_cluster.name_of(r.node) for rid, r in placed().items()}
        assert sorted(where[r.replica_id] for r in code) == ["eu", "head", "us-2"]  # one per node
        assert sorted(where[r.replica_id] for r in chat[:2]) == ["eu", "head"]  # beside it, where room is left
        for r in placed().values():
            wait_for(lambda r=r: backend.health(r.replica_id), 60, f"{r.replica_id} ready")
            body = {"model": r.spec.model, "prompt": "x", "max_tokens": 2}
            assert httpx.post(r.url + "/v1/completions", json=body, timeout=30).status_code == 200

        freed = next(r for r in chat[:2] if where[r.replica_id] == "eu")
        backend.stop(freed.replica_id)
        wait_for(lambda: waiting.replica_id in placed(), 60, "the waiting chat replica placed once room freed")
        assert ray_cluster.name_of(placed()[waiting.replica_id].node) == "eu"
        assert placed()[waiting.replica_id].pending is None
        wait_for(lambda: backend.health(waiting.replica_id), 60, "it serves")
    finally:
        backend.close()
        wait_for(lambda: not backend.stopping, 60, "every replica to stop")


def test_region_requests_stay_on_the_eu_node_while_it_has_capacity_then_spill_over(ray_cluster, model_dir, tmp_path):
    raw = deployment(
        model_dir,
        [variant("fast", lo=2, hi=2)],
        regions=["eu", "us"],
        router={"name": "region-aware", "params": {"saturation": 2}},
    )
    gw = gateway(raw, tmp_path)
    try:
        gw.wait_ready("fast", count=2, timeout=180)
        by_region = {r.region: r for r in gw.backend.list()}
        eu, us = by_region["eu"], by_region["us"]
        assert eu.node == ray_cluster.node_id("eu")  # placed by the node label region=eu
        assert ray_cluster.name_of(us.node) in ("head", "us-2")
        header = {"x-tandem-region": "eu"}
        for _ in range(4):  # one at a time: the eu replica has room for each
            assert completion(gw.url, header).status_code == 200
        assert (served_by(eu.url, gw.fleet_secret), served_by(us.url, gw.fleet_secret)) == (4, 0)

        load = Load(gw.url, workers=6, stream=lambda n: True, max_tokens=64, headers=header)
        try:
            wait_for(lambda: served_by(us.url, gw.fleet_secret) >= 2, 90, "eu requests to spill over to us")
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [] and outcomes.broken_mid_stream == []
        assert served_by(eu.url, gw.fleet_secret) > 4  # eu still served its share
        assert gw.errors() == 0
    finally:
        gw.stop()


def test_use_rolls_over_to_another_recipe_on_ray_under_load_with_no_failed_request(ray_cluster, model_dir, tmp_path):
    raw = deployment(model_dir, [variant("fast", profile=profile(GiB))])
    gw = gateway(raw, tmp_path)
    try:
        gw.wait_ready("fast", timeout=180)
        load = Load(gw.url, workers=4, stream=lambda n: n % 2 == 0, max_tokens=24)
        try:
            wait_for(lambda: load.outcomes.ok >= 4, 60, "the load to get going")
            accepted = httpx.post(gw.url + "/admin/use", json={"recipe": "int8"}, timeout=30)
            assert accepted.status_code == 202, accepted.text

            def phase() -> str:
                return httpx.get(gw.url + "/admin/rollout", timeout=10).json()["rollout"]["phase"]

            wait_for(lambda: phase() == Phase.DONE, 180, "the rollout to finish")
            wait_for(lambda: {r.variant for r in gw.backend.list()} == {"int8"}, 60, "the old variant to drain")
            served = load.outcomes.ok
            wait_for(lambda: load.outcomes.ok >= served + 4, 60, "requests on the new variant")
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [] and outcomes.broken_mid_stream == []
        assert gw.gw.fleet.controller.primary == "int8" and gw.errors() == 0
        (new,) = gw.backend.list()
        assert new.spec.memory_bytes == GiB and new.node  # the primary's resources came along, on a Ray node
        assert all(r.exit_code == 0 for r in gw.backend.exited if r.variant == "fast")
    finally:
        gw.stop()


def test_tandem_serve_backend_ray_joins_the_cluster_and_says_so(ray_cluster, model_dir, tmp_path):
    spec = tmp_path / "deploy.yaml"
    spec.write_text(
        f"model: {model_dir}\nthreads: 1\nregions: [eu]\npolicy: {{name: hpa}}\n"
        f"variants:\n  - name: fast\n    recipe: baseline\n    args: [--served-model-name, {MODEL_NAME}]\n"
    )
    args = ["--deployment", str(spec), "--backend", "ray", "--ray-address", ray_cluster.cluster.address]
    server = ServerProcess([*args, "--log-dir", str(tmp_path / "replicas")], tmp_path / "gateway.log")
    try:
        server.wait_ready(timeout=180)
        assert completion(server.url).status_code == 200
        (replica,) = httpx.get(server.url + "/admin/replicas", timeout=10).json()["replicas"]
        assert replica["node"] == ray_cluster.node_id("eu") and replica["region"] == "eu"
    finally:
        server.stop()
    log = server.log()
    assert f"replicas: Ray: connected to the Ray cluster at {ray_cluster.cluster.address} (given); 3 nodes" in log
    assert server.proc.returncode == 0, log[-3000:]


def test_an_external_engine_is_a_ray_replica_on_its_regions_node(ray_cluster, model_dir, tmp_path):
    """A stand-in OpenAI-compatible server (tests/fake_openai_server.py), not `tandem serve`, as the
    replica a Ray actor starts on the eu node: routed to, its load read from its metrics, given the
    fleet secret through `{api_key}`, stopped with its actor."""
    fake = str(Path(__file__).parents[1] / "fake_openai_server.py")
    external = {
        "name": "ext", "engine": "external", "regions": ["eu"], "replicas": {"min": 1, "max": 1},
        "command": [sys.executable, fake, "--host", "{host}", "--port", "{port}", "--served-model-name", "{variant}"],
        "env": {"API_KEY": "{api_key}"}, "metrics": {"adapter": "vllm"},
    }  # fmt: skip
    gw = gateway(deployment(model_dir, [external]), tmp_path)
    try:
        gw.wait_ready("ext", timeout=120)
        (replica,) = gw.backend.list()
        assert ray_cluster.name_of(replica.node) == "eu"
        answer = completion(gw.url)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"].startswith(" tok0"), answer.text

        def source() -> str | None:
            (view,) = httpx.get(gw.url + "/admin/replicas", timeout=10).json()["replicas"]
            return (view["load"] or {}).get("source")

        wait_for(lambda: source() == "vllm", 20, "a load report from its metrics")
    finally:
        gw.stop()
    assert [r.exit_code for r in gw.backend.exited] == [0]  # SIGTERM through the tether: it stopped cleanly


def test_a_node_removed_under_load_loses_no_request_and_the_fleet_recovers(ray_cluster, model_dir, tmp_path):
    raw = deployment(
        model_dir,
        [variant("fast", lo=2, hi=2)],
        # Leave replacing the lost replicas to Ray's report of the dead node, not to failed probes.
        controller={"drain_timeout_s": 30, "unhealthy_after": 1000},
    )
    gw = gateway(raw, tmp_path)
    try:
        gw.wait_ready("fast", count=2, timeout=180)
        head = ray_cluster.node_id("head")
        victim = next(r for r in gw.backend.list() if r.node != head)  # SPREAD put at least one off the head
        name = ray_cluster.name_of(victim.node)
        load = Load(gw.url, workers=6, stream=lambda n: n % 3 != 0, max_tokens=64)
        try:
            wait_for(lambda: load.outcomes.ok >= 6, 60, "the load to get going")
            # The machine is lost: its Ray node and every process on it (the replica's actor and server) at once.
            placement = gw.backend.placement(victim.replica_id)
            ray_cluster.cluster.remove_node(ray_cluster.nodes.pop(name), allow_graceful=False)
            for pid in (placement.host_pid, placement.pid):
                os.kill(pid, signal.SIGKILL)
            lost_at = time.monotonic()

            def reported() -> bool:  # by the backend, from Ray's word that the actor's node died
                return any(e.replica.replica_id == victim.replica_id for e in gw.gw.fleet.controller.recent_exits)

            wait_for(reported, 90, "the lost replica to be reported")
            reported_s = time.monotonic() - lost_at

            def replaced() -> bool:
                ready = [r for r in gw.backend.list() if r.state == "ready"]
                return len(ready) == 2 and victim.replica_id not in {r.replica_id for r in ready}

            wait_for(replaced, 120, "the fleet to return to 2 ready replicas")
            recovered_s = time.monotonic() - lost_at
            served = load.outcomes.ok
            wait_for(lambda: load.outcomes.ok >= served + 6, 60, "requests on the recovered fleet")
        finally:
            outcomes = load.stop()
        # Only streams that had already sent data may end with an error event; nothing else fails.
        assert outcomes.failures == [], outcomes.failures
        assert all("replica_" in detail for detail in outcomes.broken_mid_stream), outcomes.broken_mid_stream
        (ended,) = [e for e in gw.gw.fleet.controller.recent_exits if e.replica.replica_id == victim.replica_id]
        assert not ended.expected and ended.code is None  # Ray's word, not a process exit: the node died
        assert ended.error.startswith("ActorDiedError: ") and "node" in ended.error, ended.error
        assert all(ray_cluster.name_of(r.node) != name for r in gw.backend.list())
        print(f"node {name} lost: reported in {reported_s:.1f} s, 2 ready replicas again in {recovered_s:.1f} s")
    finally:
        gw.stop()
