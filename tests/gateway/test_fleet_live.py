"""Two models behind one real gateway, on real replica processes: the bundled target and the bundled
draft, each answering by `model` to the official `openai` client; /v1/models lists both; another
model is a 404 `model_not_found`; the draft, at `min: 0`, is started by its first request, which
waits at the gateway and is served; every replica shows the memory it reserves.

One module-scoped gateway for the file (its replicas are the cost): the target keeps one replica,
the draft none until asked.
"""

from __future__ import annotations

import os
import signal
import threading

import httpx
import openai
import pytest
import uvicorn
from server_process import free_port

from tandem.cluster.local import LocalBackend, popen_spawner
from tandem.deployment.fleet_file import parse_fleet
from tandem.gateway.app import create_gateway_app
from tandem.gateway.model_backend import shared_backend
from tandem.gateway.models import build_fleet_gateway
from tandem.gateway.wiring import FLEET_SECRET_ENV, new_fleet_secret

from .harness import wait_for

TARGET, DRAFT = "tandem-code-target", "tandem-code-draft"
ARGS = ["--max-num-seqs", "4", "--kv-cache-tokens", "2048"]  # light replicas: this machine is shared


def fleet_file() -> dict:
    return {
        "threads": 1,
        "policy": {"name": "kpa", "interval_s": 0.25},
        "models": [
            {"name": TARGET, "model": f"bundled:{TARGET}",
             "variants": [{"name": "base", "recipe": "baseline", "replicas": {"min": 1, "max": 1}, "args": ARGS}]},
            {"name": DRAFT, "model": f"bundled:{DRAFT}",
             "variants": [{"name": "base", "recipe": "baseline", "replicas": {"min": 0, "max": 1}, "args": ARGS}]},
        ],
    }  # fmt: skip


class FleetGateway:
    def __init__(self, raw: dict, log_dir) -> None:
        secret = new_fleet_secret()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_") or k == "TANDEM_CACHE"}
        env[FLEET_SECRET_ENV] = secret
        plan = parse_fleet(raw)
        self.local = LocalBackend(
            spawn=popen_spawner(log_dir), base_env=env, kill_after_s=20.0, memory_bytes=plan.nodes.memory_bytes
        )
        self.log_dir = log_dir
        self.gw = build_fleet_gateway(plan, self.local, buffer_timeout_s=90.0, fleet_secret=secret)
        self.url = f"http://127.0.0.1:{free_port()}"
        config = uvicorn.Config(
            create_gateway_app(self.gw), host="127.0.0.1", port=int(self.url.rsplit(":", 1)[1]), log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # not the main thread
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "the gateway to listen")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.log_dir.glob("*.log"))

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        try:
            wait_for(lambda: not self.local.stopping, 30, "replicas to exit")
        except AssertionError:
            for proc in self.local._stopping.values():  # a straggler: leave no process behind
                try:
                    os.kill(proc.handle.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    running = FleetGateway(fleet_file(), tmp_path_factory.mktemp("fleet-logs"))
    try:
        target = running.gw.models[TARGET]
        try:
            wait_for(target.fleet.ready, 120, "the target's replica")
        except AssertionError:
            raise AssertionError(running.logs()) from None
        yield running
    finally:
        running.stop()


def _client(fleet: FleetGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_target_answers_by_model_and_the_gateway_knows_both_models(fleet):
    client = _client(fleet)
    done = client.completions.create(model=TARGET, prompt="def add(a, b):", max_tokens=4, temperature=0)
    assert done.model == TARGET and done.choices[0].text and done.usage.completion_tokens > 0
    listed = {m.id: m for m in client.models.list()}
    assert set(listed) == {TARGET, DRAFT}
    assert listed[TARGET].model_extra["tandem"]["variants"][0]["name"] == "base"
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert caught.value.code == "model_not_found" and TARGET in caught.value.message
    replicas = httpx.get(fleet.url + "/admin/replicas", timeout=10).json()["replicas"]
    assert replicas and all(r["memory_bytes"] > 0 for r in replicas)
    shared = shared_backend(fleet.gw.fleet.backend)
    assert {r.replica_id for r in shared.list()} >= {r["id"] for r in replicas}


def test_the_draft_at_zero_is_started_by_its_first_request_which_is_served(fleet):
    draft = fleet.gw.models[DRAFT]
    assert draft.fleet.backend.list() == []  # nothing until asked
    client = _client(fleet)
    try:
        chat = client.chat.completions.create(
            model=DRAFT, messages=[{"role": "user", "content": "def f(x):"}], max_tokens=4, temperature=0
        )
    except openai.APIError:
        raise AssertionError(fleet.logs()) from None
    assert chat.model == DRAFT and chat.choices[0].message.content is not None
    shown = {m["name"]: m for m in httpx.get(fleet.url + "/admin/models", timeout=10).json()["models"]}
    assert shown[DRAFT]["cold_starts"] == 1 and shown[DRAFT]["last_cold_start_s"] > 0
    assert shown[DRAFT]["replicas"]["ready"] == 1 and shown[DRAFT]["memory_bytes"] > 0
    assert shown[TARGET]["memory_bytes"] > shown[DRAFT]["memory_bytes"]  # the larger model reserves more
    replicas = httpx.get(fleet.url + "/admin/replicas", timeout=10).json()["replicas"]
    assert {r["model"] for r in replicas} == {TARGET, DRAFT} and all(r["memory_bytes"] > 0 for r in replicas)
    metrics = httpx.get(fleet.url + "/metrics", timeout=10).text
    assert f'model="{DRAFT}"' in metrics and 'model="gpt-4"' not in metrics
