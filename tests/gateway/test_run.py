"""The gateway as its own process (`python -m tandem.cli serve --replicas-* ...`) with real replicas:
no libtorch in it, settings from a file and TANDEM_* variables, a bad recipe ends it with the replica's
own error, SIGKILL leaves no replica behind, a client that leaves while buffered is forgotten, and
SIGTERM (then a second signal) answers waiting requests with 503 and exits 0 without a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess, _environment, free_port
from timing import within

from .harness import MODEL_NAME, metric, wait_for

pytestmark = pytest.mark.slow

KEY = "gateway-key"
BODY = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 6}


def replica_processes(*markers: str) -> list[int]:
    """Processes whose command line holds every marker and a --replica-id (the gateway's replicas)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace") if entry.name.isdigit() else ""
        except OSError:
            continue
        if all(marker in cmdline for marker in markers) and "\0--replica-id\0" in cmdline:
            pids.append(int(entry.name))
    return pids


def check_the_fleet_secret(gateway: ServerProcess, replica: dict, replica_log: Path, user_auth: dict) -> None:
    """The replica's port answers only its gateway: not without the fleet's secret, not with the user's key.
    The secret is in the replica's environment (readable by its user only), in no command line, in no log."""
    url = replica["address"]
    for headers in ({}, user_auth):
        assert httpx.post(url + "/v1/completions", json=BODY, headers=headers, timeout=30).status_code == 401
        assert httpx.get(url + "/load", headers=headers, timeout=30).status_code == 401
        assert httpx.get(url + "/metrics", headers=headers, timeout=30).status_code == 401
    assert httpx.get(url + "/health", timeout=30).status_code == 200  # probes stay open
    # Its id and its port: the other test worker may run a replica of the same id at the same time.
    (pid,) = replica_processes(f"\0{replica['id']}\0", f"\0{replica['address'].rsplit(':', 1)[1]}\0")
    environ = dict(
        entry.split("=", 1) for entry in (Path("/proc") / str(pid) / "environ").read_text().split("\0") if "=" in entry
    )
    secret = environ["TANDEM_FLEET_SECRET"]
    assert len(secret) >= 32
    fleet = {"Authorization": f"Bearer {secret}"}
    assert httpx.post(url + "/v1/completions", json=BODY, headers=fleet, timeout=60).status_code == 200
    assert secret not in gateway.log() and secret not in replica_log.read_text(errors="replace")
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace") if entry.name.isdigit() else ""
        except OSError:
            continue
        assert secret not in cmdline, f"the fleet secret is on the command line of pid {entry.name}"


def maps(pid: int) -> str:
    return (Path("/proc") / str(pid) / "maps").read_text()


def scale_from_zero(model_dir: Path, log_dir: Path) -> list[str]:
    """A gateway with no replica until a request comes: that request waits (buffered) while one starts."""
    return [
        "--model", str(model_dir), "--served-model-name", MODEL_NAME, "--threads", "1", "--recipe", "baseline",
        "--replicas-min", "0", "--replicas-max", "1", "--policy", "kpa", "--log-dir", str(log_dir),
    ]  # fmt: skip


def buffered(url: str) -> float:
    return metric(httpx.get(url + "/metrics", timeout=10).text, "tandem:gateway_buffered_requests", variant="baseline")


def test_a_gateway_process_from_a_config_file_and_the_environment_maps_no_libtorch(serve_model_dir, tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"model: {serve_model_dir}\nrecipe: baseline\nthreads: 1\nserved-model-name: {MODEL_NAME}\n"
        f"policy: hpa\nreplicas_min: 1\nlog_dir: {tmp_path / 'replicas'}\nlog_level: warning\n"
    )
    env = {"TANDEM_REPLICAS_MAX": "1", "TANDEM_API_KEY": KEY, "TANDEM_REPLICA_PORTS": "29100-29199"}
    gateway = ServerProcess(["--config", str(config)], tmp_path / "gateway.log", env=env)
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        gateway.wait_ready(timeout=120)
        assert "libtorch" not in maps(gateway.proc.pid) and "libtorch" in maps(
            replica_processes(str(serve_model_dir))[0]
        )
        assert httpx.post(gateway.url + "/v1/completions", json=BODY, timeout=60).status_code == 401
        r = httpx.post(gateway.url + "/v1/completions", json=BODY, headers=auth, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
        with httpx.stream("POST", gateway.url + "/v1/completions", json={**BODY, "stream": True}, headers=auth) as s:
            assert s.status_code == 200 and "".join(s.iter_text()).rstrip().endswith("data: [DONE]")
        bad = httpx.post(gateway.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": 5}, headers=auth)
        assert bad.status_code == 400 and "error" in bad.json()  # the replica's own client error, passed through

        def replica_with_load() -> dict | None:
            (replica,) = httpx.get(gateway.url + "/admin/replicas", headers=auth, timeout=10).json()["replicas"]
            return replica if replica["load"] is not None else None

        replica = wait_for(replica_with_load, within(10), "the replica's own load report")
        assert 29100 <= int(replica["address"].rsplit(":", 1)[1]) <= 29199 and replica["load"]["healthy"]
        assert (tmp_path / "replicas" / f"{replica['id']}.log").is_file()
        check_the_fleet_secret(gateway, replica, tmp_path / "replicas" / f"{replica['id']}.log", auth)
        text = httpx.get(gateway.url + "/metrics", timeout=10).text
        assert metric(text, "tandem:gateway_requests_total", variant="baseline", code="200") == 2
        assert metric(text, "tandem:gateway_requests_total", variant="baseline", code="400") == 1
        assert metric(text, "tandem:gateway_time_to_first_byte_seconds_count", variant="baseline") == 3
        assert metric(text, "tandem:gateway_request_duration_seconds_count", variant="baseline") == 3
        assert metric(text, "tandem:replicas", variant="baseline", state="ready") == 1
    finally:
        code = gateway.stop()
    assert code == 0, gateway.log()
    wait_for(lambda: not replica_processes(str(serve_model_dir)), within(10), "the replicas to exit")
    assert "Traceback" not in gateway.log()


def test_a_bad_recipe_ends_the_gateway_with_the_replicas_own_error_within_a_minute(serve_model_dir, tmp_path):
    argv = [
        sys.executable, "-m", "tandem.cli", "serve", "--model", str(serve_model_dir), "--threads", "1",
        "--recipe", "speculative(q=3)", "--replicas-max", "1", "--policy", "hpa", "--port", "0",
        "--log-dir", str(tmp_path / "replicas"),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=within(60), env=_environment(None))
    assert done.returncode != 0
    assert "'speculative' has no parameter 'q'" in done.stderr
    assert "the gateway gives up" in done.stderr and "Traceback" not in done.stderr
    assert len(list((tmp_path / "replicas").glob("*.log"))) == 3  # three attempts, each with its own log
    assert time.monotonic() - started < within(60)


def test_sigkill_of_the_gateway_leaves_no_replica_behind(serve_model_dir, tmp_path):
    args = ["--model", str(serve_model_dir), "--served-model-name", MODEL_NAME, "--threads", "1", "--recipe"]
    args += ["baseline", "--replicas-min", "1", "--replicas-max", "1", "--policy", "hpa"]
    gateway = ServerProcess(args + ["--log-dir", str(tmp_path / "replicas")], tmp_path / "gateway.log")
    try:
        gateway.wait_ready(timeout=120)
        wait_for(lambda: replica_processes(str(serve_model_dir)), 60, "the replica to run")
        os.kill(gateway.proc.pid, signal.SIGKILL)
        gateway.proc.wait(10)
        wait_for(lambda: not replica_processes(str(serve_model_dir)), within(10), "the orphaned replicas to exit")
    finally:
        gateway.stop()
        for pid in replica_processes(str(serve_model_dir)):
            os.kill(pid, signal.SIGKILL)


def test_a_client_that_leaves_while_buffered_is_forgotten_and_two_signals_exit_cleanly(serve_model_dir, tmp_path):
    gateway = ServerProcess(scale_from_zero(serve_model_dir, tmp_path / "replicas"), tmp_path / "gateway.log")
    try:
        wait_for(lambda: _answers(gateway.url), 60, "the gateway to listen")
        with pytest.raises(httpx.ReadTimeout):  # the replica takes seconds to start; the client leaves after 0.5
            httpx.post(gateway.url + "/v1/completions", json=BODY, timeout=httpx.Timeout(10, read=0.5))
        wait_for(lambda: buffered(gateway.url) == 0, within(5), "the abandoned request to leave the buffer")
        text = httpx.get(gateway.url + "/metrics", timeout=10).text
        assert metric(text, "tandem:gateway_requests_total", variant="none", code="499") == 1
        waiting = threading.Thread(target=lambda: httpx.post(gateway.url + "/v1/completions", json=BODY, timeout=60))
        waiting.start()  # this one stays: a replica starts for it
        wait_for(lambda: replica_processes(str(serve_model_dir)), 30, "a replica to start")
        gateway.terminate()
        time.sleep(0.1)
        gateway.proc.send_signal(signal.SIGINT)  # impatient: a second signal, while the replicas stop
        time.sleep(0.1)
        gateway.proc.send_signal(signal.SIGINT)  # and a third
        assert gateway.wait(60) == 0
        waiting.join(30)
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.log() and "KeyboardInterrupt" not in gateway.log()
    wait_for(lambda: not replica_processes(str(serve_model_dir)), within(10), "the replicas to exit")


def test_sigterm_answers_buffered_requests_with_503_and_exits_0(serve_model_dir, tmp_path):
    gateway = ServerProcess(scale_from_zero(serve_model_dir, tmp_path / "replicas"), tmp_path / "gateway.log")
    answers: list[httpx.Response] = []

    def client() -> None:
        answers.append(httpx.post(gateway.url + "/v1/completions", json=BODY, timeout=60))

    try:
        wait_for(lambda: _answers(gateway.url), 60, "the gateway to listen")
        clients = [threading.Thread(target=client) for _ in range(2)]
        for thread in clients:
            thread.start()
        wait_for(lambda: buffered(gateway.url) == 2, within(10), "both requests to wait for the replica", every=0.02)
        gateway.terminate()
        for thread in clients:
            thread.join(30)
        assert [a.status_code for a in answers] == [503, 503]
        assert {a.json()["error"]["code"] for a in answers} == {"shutting_down"}
        assert gateway.wait(60) == 0
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.log() and "SIGTERM: admitting no new requests" in gateway.log()
    wait_for(lambda: not replica_processes(str(serve_model_dir)), within(10), "the replicas to exit")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_replica_ports_that_hold_the_gateways_own_port_are_refused_at_start_up(tmp_path):
    port = free_port()
    argv = [
        sys.executable, "-m", "tandem.cli", "serve", "--recipe", "baseline", "--replicas-max", "1",
        "--host", "127.0.0.1", "--port", str(port), "--replica-ports", f"{port}-{port}", "--log-dir", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_environment(None))
    assert done.returncode == 1, done.stderr
    assert f"--replica-ports {port}-{port} holds the gateway's own port {port}" in done.stderr
    assert "Traceback" not in done.stderr and "no free port" not in done.stderr
    assert not list(tmp_path.glob("*.log"))  # refused before any replica was tried
