"""The seed's payoff on real replicas: a node's budget holds the first model's baseline replica but not
also the second model's, so the second waits pending with its reason; `POST /admin/use {"model": ...,
"recipe": "int8+kv-bf16"}` shrinks the first model's replica (the rollout replaces it) and the second
model's pending replica is placed in the room freed, and serves, while a client's requests to the
first model never fail.

The budget is chosen from the computed needs (tandem.deployment.memory_need), so the case holds on
any machine: baseline + int8 of the first model fit (the rollout starts the new replica before it
drains the old), baseline + the second do not, int8 + the second do.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from tandem.data.bundled import bundled_model_dir
from tandem.deployment.memory_need import replica_bytes_from_args

from .harness import wait_for
from .test_fleet_live import ARGS, DRAFT, TARGET, FleetGateway

NARROW = "int8+kv-bf16"
BASELINE_BYTES = replica_bytes_from_args(str(bundled_model_dir()), "baseline", ARGS)
NARROW_BYTES = replica_bytes_from_args(str(bundled_model_dir()), NARROW, ARGS)
BUDGET = BASELINE_BYTES + NARROW_BYTES + (8 << 20)
DRAFT_BYTES = NARROW_BYTES + (16 << 20)  # given: more than the budget leaves beside the baseline


def fleet_file() -> dict:
    return {
        "threads": 1,
        "nodes": {"memory": BUDGET},
        "policy": {"name": "kpa", "interval_s": 0.25},
        "models": [
            {"name": TARGET, "model": f"bundled:{TARGET}",
             "variants": [{"name": "base", "recipe": "baseline", "replicas": {"min": 1, "max": 1}, "args": ARGS}]},
            {"name": DRAFT, "model": f"bundled:{DRAFT}",
             "variants": [{"name": "base", "recipe": "baseline", "replicas": {"min": 1, "max": 1}, "args": ARGS,
                           "resources": {"memory": DRAFT_BYTES}}]},
        ],
    }  # fmt: skip


class ClientLoop:
    """Requests to one model, one after another, until stopped: every answer counted."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model
        self.ok, self.failures = 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as client:
            while not self.stop.is_set():
                body = {"model": self.model, "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0}
                try:
                    response = client.post("/v1/completions", json=body)
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                if response.status_code == 200:
                    self.ok += 1
                else:
                    self.failures.append(f"{response.status_code} {response.text[:200]}")

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(150)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    running = FleetGateway(fleet_file(), tmp_path_factory.mktemp("payoff-logs"))
    yield running
    running.stop()


def _models(fleet: FleetGateway) -> dict:
    return {m["name"]: m for m in httpx.get(fleet.url + "/admin/models", timeout=10).json()["models"]}


def test_a_narrower_recipe_makes_room_for_a_second_model_with_no_failed_request(fleet):
    target, draft = fleet.gw.models[TARGET], fleet.gw.models[DRAFT]
    try:
        wait_for(target.fleet.ready, 180, "the first model's baseline replica")
    except AssertionError:
        raise AssertionError(fleet.logs()) from None
    replicas = httpx.get(fleet.url + f"/admin/replicas?model={DRAFT}", timeout=10).json()["replicas"]
    (waiting,) = replicas
    assert waiting["state"] == "starting" and waiting["memory_bytes"] == DRAFT_BYTES
    assert waiting["reason"].startswith("no room: needs") and "free" in waiting["reason"]
    before = _models(fleet)
    assert before[TARGET]["memory_bytes"] == BASELINE_BYTES and before[DRAFT]["replicas"]["pending"] == 1

    loop = ClientLoop(fleet.url, TARGET)
    try:
        wait_for(lambda: loop.ok >= 2, 60, "the client's first answers")
        used = httpx.post(fleet.url + "/admin/use", json={"model": TARGET, "recipe": NARROW}, timeout=30)
        assert used.status_code == 202, used.text

        def switched() -> bool:
            rollout = httpx.get(fleet.url + f"/admin/rollout?model={TARGET}", timeout=10).json()["rollout"]
            assert rollout["phase"] != "aborted", rollout
            return rollout["phase"] == "done"

        wait_for(switched, 240, "the rollout to the narrower recipe")
        wait_for(draft.fleet.ready, 240, "the second model's replica, placed in the room freed")
        served = httpx.post(
            fleet.url + "/v1/completions", json={"model": DRAFT, "prompt": "def f(x):", "max_tokens": 4}, timeout=120
        )
        assert served.status_code == 200 and served.json()["model"] == DRAFT
        wait_for(lambda: loop.ok >= 3, 60, "the first model still answering")
    except AssertionError:
        loop.finish()
        raise AssertionError(fleet.logs()) from None
    loop.finish()
    assert loop.failures == [] and loop.ok >= 3
    after = _models(fleet)
    assert after[TARGET]["memory_bytes"] == NARROW_BYTES < BASELINE_BYTES
    assert after[DRAFT]["replicas"] == {"starting": 0, "ready": 1, "draining": 0, "pending": 0}
    assert after[TARGET]["memory_bytes"] + after[DRAFT]["memory_bytes"] <= BUDGET
