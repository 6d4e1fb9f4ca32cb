"""A real gateway (uvicorn in a thread, on a loopback port) in front of real local replicas, and a
gateway as its own process (`tandem serve --replicas-* ...`).

The in-thread one keeps the `Gateway` object, so a test can kill a replica by pid or read the
in-flight counts, while clients talk HTTP to the gateway exactly as they would in production. Its
replicas are local processes, or those of the backend a test passes (Ray's: tests/cluster).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from metrics_text import parse, total, value
from server_process import free_port

from tandem.cluster.backend import Backend
from tandem.cluster.local import LocalBackend, popen_spawner
from tandem.deployment import parse_deployment
from tandem.gateway.app import create_gateway_app
from tandem.gateway.wiring import FLEET_SECRET_ENV, Gateway, build_gateway, new_fleet_secret

MODEL_NAME = "tiny"
REPLICA_ARGS = ["--served-model-name", MODEL_NAME, "--max-num-seqs", "8", "--max-queue", "64"]


def variant(name: str, recipe: str = "baseline", lo: int = 1, hi: int = 1) -> dict[str, Any]:
    return {"name": name, "recipe": recipe, "replicas": {"min": lo, "max": hi}, "args": REPLICA_ARGS}


def wait_for(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the one sample named `name` with these labels in Prometheus text (0 when absent)."""
    return value(parse(text), name, **labels)


def server_errors(text: str) -> float:
    """Requests the gateway answered with a 5xx."""
    return total(parse(text), "tandem:gateway_requests_total", lambda labels: labels["code"].startswith("5"))


def total_retries(text: str) -> float:
    """Attempts the gateway re-ran after a failure, all variants."""
    return total(parse(text), "tandem:gateway_retries_total")


class RunningGateway:
    def __init__(
        self, raw: dict[str, Any], log_dir: Path, transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None, backend: Backend | None = None, fleet_secret: str | None = None,
        prepare: Callable[[Gateway], None] | None = None, **gateway: Any,
    ) -> None:  # fmt: skip
        """`gateway`: more build_gateway arguments (first_byte_timeout_s=...). A given `backend` hands
        its replicas `fleet_secret` (FLEET_SECRET_ENV) itself. `prepare(gw)` runs before the app is made
        (tenancy: tandem.gateway.tenant_app.enable_tenancy)."""
        # As `tandem serve` does: replicas answer only this gateway.
        self.fleet_secret = fleet_secret or new_fleet_secret()
        if backend is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_") or k == "TANDEM_CACHE"}
            env[FLEET_SECRET_ENV] = self.fleet_secret
            backend = LocalBackend(spawn=popen_spawner(log_dir), base_env=env, kill_after_s=20.0)
        self.log_dir = log_dir
        self.gw: Gateway = build_gateway(
            parse_deployment(raw), backend, transport=transport, buffer_timeout_s=90.0, read_timeout_s=60.0,
            fleet_secret=self.fleet_secret, **gateway,
        )  # fmt: skip
        if prepare is not None:
            prepare(self.gw)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_gateway_app(self.gw, api_key=api_key), host="127.0.0.1", port=self.port, log_level="warning",
            lifespan="on",
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None  # not the main thread
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "the gateway to listen")

    @property
    def backend(self) -> Any:  # LocalBackend, or the backend given (tests reach into either)
        return self.gw.fleet.backend

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.log_dir.glob("*.log"))

    def wait_ready(self, variant: str, count: int = 1, timeout: float = 120.0) -> None:
        def ready() -> bool:
            return sum(1 for r in self.backend.list() if r.variant == variant and r.state == "ready") >= count

        try:
            wait_for(ready, timeout, f"{count} ready replicas of {variant}")
        except AssertionError:
            raise AssertionError(f"{variant} not ready:\n{self.logs()}") from None

    def settled(self) -> None:
        """No request is left counted in flight (each attempt was reported exactly once)."""
        wait_for(
            lambda: not self.gw.fleet.inflight.running,
            10,
            f"in-flight counts to settle: {self.gw.fleet.inflight.running}",
        )

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def errors(self) -> float:
        return server_errors(self.metrics())

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        backend = self.backend
        try:
            wait_for(lambda: not backend.stopping, 30, "replicas to exit")
        except AssertionError:
            pass
        if isinstance(backend, LocalBackend):
            for proc in backend._stopping.values():  # a straggler: do not leave processes behind
                try:
                    os.kill(proc.handle.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        else:  # a RayBackend: its placer kills what is still shutting down
            for replica_id in backend.stopping:
                backend.placer.kill(replica_id)


class Outcomes:
    """What clients saw: every request's result, thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok = 0
        self.failures: list[str] = []
        self.broken_mid_stream: list[str] = []

    def add(self, ok: bool, detail: str = "", mid_stream: bool = False) -> None:
        with self.lock:
            if ok:
                self.ok += 1
            elif mid_stream:
                self.broken_mid_stream.append(detail)
            else:
                self.failures.append(detail)


def one_request(client: httpx.Client, url: str, outcomes: Outcomes, stream: bool, max_tokens: int = 24) -> None:
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": stream}
    got_data = False
    try:
        if not stream:
            r = client.post(url + "/v1/completions", json=body)
            ok = r.status_code == 200 and r.json()["choices"][0]["text"] is not None
            outcomes.add(ok, f"{r.status_code} {r.text[:200]}")
            return
        with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                outcomes.add(False, f"{r.status_code} {r.read()[:200]!r}")
                return
            text = ""
            for chunk in r.iter_text():
                text += chunk
                got_data = got_data or "data:" in text
            ok = text.rstrip().endswith("data: [DONE]") and '"error"' not in text
            outcomes.add(ok, f"stream: {text[-200:]!r}", mid_stream=got_data and not ok)
    except httpx.HTTPError as exc:
        outcomes.add(False, f"{type(exc).__name__}: {exc}", mid_stream=got_data)


class Load:
    """`workers` client threads sending requests to the gateway until stopped."""

    def __init__(
        self, url: str, workers: int, stream: Callable[[int], bool], max_tokens: int = 24,
        headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.url = url
        self.headers = headers
        self.outcomes = Outcomes()
        self.stopped = threading.Event()
        self.threads = [
            threading.Thread(target=self._work, args=(i, stream, max_tokens), daemon=True) for i in range(workers)
        ]
        for thread in self.threads:
            thread.start()

    def _work(self, worker: int, stream: Callable[[int], bool], max_tokens: int) -> None:
        with httpx.Client(timeout=120, headers=self.headers) as client:
            n = 0
            while not self.stopped.is_set():
                one_request(client, self.url, self.outcomes, stream(worker + n), max_tokens)
                n += 1

    def stop(self) -> Outcomes:
        self.stopped.set()
        for thread in self.threads:
            thread.join(120)
        return self.outcomes
