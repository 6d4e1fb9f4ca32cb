"""External engines on a backend: the command template rendered with the replica's port, the fleet
secret only where the template asks for it, the readiness probe at the engine's own path."""

from __future__ import annotations

import sys

import pytest

from tandem.cluster import LocalBackend, ReplicaSpec, ReplicaState
from tandem.cluster.external import FLEET_SECRET_ENV, ExternalEngine, external_command, template_fields
from tandem.cluster.local import replica_launch

LLAMA = ("llama-server", "-m", "{model}", "--host", "{host}", "--port", "{port}", "-t", "{threads}",
         "--alias", "{served_model_name}", "--metrics")  # fmt: skip


def spec(**engine) -> ReplicaSpec:
    return ReplicaSpec("q8", None, model="/m/q8.gguf", region="eu", threads=2,
                       engine=ExternalEngine(command=LLAMA, **engine))  # fmt: skip


def test_the_template_is_rendered_for_this_replica_on_a_tether():
    env = {"PATH": "/bin", FLEET_SECRET_ENV: "s3cret"}
    argv, out_env = replica_launch(spec(served_model_name="llama"), 9001, "10.0.0.5", "q8-3", env, parent_pid=77)
    assert argv[:6] == [sys.executable, "-m", "tandem.cluster.tether", "--parent-pid", "77", "--"]
    assert argv[6:] == ["llama-server", "-m", "/m/q8.gguf", "--host", "10.0.0.5", "--port", "9001", "-t", "2",
                        "--alias", "llama", "--metrics"]  # fmt: skip
    assert out_env == {"PATH": "/bin"}  # no template asked for the fleet's secret: the engine does not get it


def test_the_fleet_secret_reaches_an_engine_only_through_its_template():
    engine = spec(env=(("VLLM_API_KEY", "{api_key}"), ("REGION", "{region}-{replica_id}")))
    argv, env = replica_launch(engine, 9001, "h", "q8-1", {FLEET_SECRET_ENV: "s3cret"}, parent_pid=None)
    assert env == {"VLLM_API_KEY": "s3cret", "REGION": "eu-q8-1"}
    assert "s3cret" not in " ".join(argv) and argv[0] == "llama-server"  # no tether without a parent pid


def test_a_tandem_replica_keeps_its_command_and_its_secret():
    tandem = ReplicaSpec("fast", "int8", threads=1)
    argv, env = replica_launch(tandem, 9001, "h", "fast-1", {FLEET_SECRET_ENV: "s"}, parent_pid=5)
    assert argv[1:4] == ["-m", "tandem.cli", "serve"] and env == {FLEET_SECRET_ENV: "s"}


def test_templates_name_known_placeholders_only():
    assert template_fields("{host}:{port}") == ["host", "port"]
    assert template_fields("{{literal}}") == []
    with pytest.raises(ValueError, match=r"unknown placeholder \{gpu\}"):
        ExternalEngine(command=("srv", "--gpu", "{gpu}"))
    with pytest.raises(ValueError, match="unknown metrics adapter"):
        ExternalEngine(command=("srv",), metrics_adapter="tgi")
    assert external_command(ExternalEngine(command=("srv", "{{x}}")), {}) == ["srv", "{x}"]


class Process:
    pid = 1

    def poll(self):
        return None

    def output_tail(self) -> str:
        return ""


def test_local_backend_starts_it_and_probes_its_ready_path():
    started, probed = [], []
    backend = LocalBackend(
        spawn=lambda argv, env, rid: started.append((argv, env)) or Process(),
        ports=lambda taken: 9100, probe=lambda url, path="/ready": probed.append(url + path) or True,
        clock=lambda: 0.0, base_env={FLEET_SECRET_ENV: "s"}, parent_pid=9,
    )  # fmt: skip
    replica = backend.start(spec(ready_path="/v1/models"))
    ((argv, env),) = started
    assert "--port" in argv and argv[argv.index("--port") + 1] == "9100" and FLEET_SECRET_ENV not in env
    assert env["OMP_NUM_THREADS"] == "2"
    assert backend.health(replica.replica_id) and probed == ["http://127.0.0.1:9100/v1/models"]
    assert backend.list()[0].state is ReplicaState.READY
    tandem = backend.start(ReplicaSpec("cpu", None))
    backend.health(tandem.replica_id)
    assert probed[-1] == "http://127.0.0.1:9100/ready"  # tandem replicas: the probe as before, at /ready
