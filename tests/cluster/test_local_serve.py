"""LocalBackend and the Controller with real `tandem serve` replicas on loopback (tiny model, one
thread each): the controller starts two, both answer /ready and a completion, then it drains and
stops one (SIGTERM; the server exits 0) and the other keeps serving. Polls with deadlines; asserts
outcomes, never durations."""

from __future__ import annotations

import time

import httpx
import pytest

from tandem.cluster import LocalBackend, ReplicaState
from tandem.cluster.local import popen_spawner
from tandem.schedule.controller import Controller, Pool
from tandem.schedule.policies import ScaleLimits
from tandem.schedule.traffic import InFlight
from tandem.schedule.variant import Variant

pytestmark = pytest.mark.slow


class Scripted:
    def __init__(self, desired: int) -> None:
        self.desired = desired

    def __call__(self, ctx):
        return self.desired, ctx.state


def until(condition, what: str, controller: Controller | None = None, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if controller is not None:
            controller.tick()
        time.sleep(0.2)


def complete(url: str) -> str:
    body = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def test_controller_scales_real_replicas_up_and_drains_one_down(tiny_llama_dir, tmp_path):
    variant = Variant(
        "tiny", "baseline", model=str(tiny_llama_dir), threads=1, extra_args=("--served-model-name", "tiny")
    )
    backend = LocalBackend(spawn=popen_spawner(tmp_path), kill_after_s=60.0)
    inflight = InFlight()
    policy = Scripted(2)
    limits = ScaleLimits(min_replicas=1, max_replicas=2)
    controller = Controller(backend, [Pool(variant, "scripted", policy, limits)], time.monotonic, inflight.loads)
    try:
        controller.tick()
        until(lambda: [r.state for r in backend.list()] == [ReplicaState.READY] * 2, "two ready replicas", controller)
        for replica in backend.list():
            complete(replica.url)  # each one serves

        policy.desired = 1
        report = controller.tick()
        assert len(report.drained) == 1
        victim = report.drained[0]
        until(lambda: victim not in [r.replica_id for r in backend.list()], "the drained replica to stop", controller)
        until(lambda: not backend.stopping, "the drained replica's process to exit")
        assert [r.exit_code for r in backend.exited if r.replica_id == victim] == [0]  # a clean SIGTERM shutdown
        (survivor,) = backend.list()
        complete(survivor.url)
    finally:
        backend.close()
        until(lambda: not backend.stopping, "every replica to exit", timeout_s=90.0)
