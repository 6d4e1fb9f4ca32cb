"""Fault tests of the gateway over loopback, real replicas behind it.

(a) 20% injected failures on the optimized variant: zero client errors, fallbacks counted, the
    breaker opens, half-opens and closes once the fault stops;
(b) a replica SIGKILLed under streaming load: no request that had not started streaming is lost;
(c) `POST /admin/use` under load (a rollout to another recipe): zero failed requests.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import httpx
import pytest

from tandem.schedule.rollout import Phase

from .harness import Load, RunningGateway, metric, total_retries, variant, wait_for


class FaultyTransport(httpx.AsyncBaseTransport):
    """Answers 500 instead of the replica for a seeded `rate` of requests sent to `faulty` URLs."""

    def __init__(self, rate: float, seed: int = 7) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.rate = rate
        self.rng = random.Random(seed)
        self.active = True
        self.faulty: set[str] = set()  # base URLs of the replicas to break
        self.injected = 0
        self.lock = threading.Lock()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if request.method == "POST" and self.active and base in self.faulty:
            with self.lock:
                hit = self.rng.random() < self.rate
            if hit:
                self.injected += 1
                return httpx.Response(500, json={"error": {"message": "injected fault", "code": "injected"}})
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.slow
def test_injected_failures_fall_back_with_no_client_error_and_the_breaker_recovers(serve_model_dir, tmp_path):
    transport = FaultyTransport(rate=0.2)
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [variant("fast"), variant("baseline")],
        "fallback": "baseline",
        "policy": {"name": "hpa", "interval_s": 0.5},
        "breaker": {"consecutive_failures": 3, "failure_ratio": 0.1, "min_calls": 5, "window_s": 60, "open_s": 1.5},
    }
    gw = RunningGateway(raw, tmp_path / "logs", transport=transport)
    try:
        gw.wait_ready("fast")
        gw.wait_ready("baseline")
        transport.faulty = {r.url for r in gw.backend.list() if r.variant == "fast"}

        def breaker() -> float | None:
            return metric(gw.metrics(), "tandem:breaker_state", variant="fast")

        load = Load(gw.url, workers=4, stream=lambda n: n % 3 == 0, max_tokens=8)
        try:
            wait_for(lambda: breaker() == 2, 60, "the breaker of fast to open")
        finally:
            transport.active = False  # the fault stops
            outcomes = load.stop()
        assert transport.injected > 0
        assert outcomes.failures == [] and outcomes.broken_mid_stream == []
        text = gw.metrics()
        assert metric(text, "tandem:fallback_total", variant="fast") > 0

        wait_for(lambda: breaker() == 1, 30, "the breaker to half-open")
        quiet = Load(gw.url, workers=1, stream=lambda n: False, max_tokens=4)
        try:
            wait_for(lambda: breaker() == 0, 30, "the breaker to close")
        finally:
            after = quiet.stop()
        assert after.failures == [] and after.ok >= 2
        assert gw.errors() == 0
        gw.settled()

        # A client that leaves mid-stream: the attempt is abandoned, the replica's request ends.
        body = {"model": "tiny", "prompt": "Once", "max_tokens": 400, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            next(r.iter_raw())
        gw.settled()
    finally:
        gw.stop()


@pytest.mark.slow
def test_a_killed_replica_loses_no_request_that_had_not_started_streaming(serve_model_dir, tmp_path):
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [variant("fast", lo=2, hi=2)],
        "policy": {"name": "hpa", "interval_s": 0.5, "params": {"target": 100}},
    }
    gw = RunningGateway(raw, tmp_path / "logs")
    try:
        gw.wait_ready("fast", count=2)
        load = Load(gw.url, workers=6, stream=lambda n: n % 4 != 0, max_tokens=64)
        try:
            wait_for(lambda: load.outcomes.ok >= 6, 60, "the load to get going")

            def stopped_while_busy() -> str | None:
                # A replica seen with 2 requests can finish both (a tiny model's request takes a fraction
                # of a second) before the kill: stop it first, let what it had written reach the gateway,
                # and kill it only if it still holds a request (else let it go on and look again).
                running = gw.gw.fleet.inflight.running
                rid = next((rid for rid, n in running.items() if n >= 2), None)
                if rid is None:
                    return None
                os.kill(gw.backend.pid(rid), signal.SIGSTOP)
                time.sleep(0.5)
                if running.get(rid, 0) >= 1:
                    return rid
                os.kill(gw.backend.pid(rid), signal.SIGCONT)
                return None

            busy = wait_for(stopped_while_busy, 30, "a busy replica")
            os.kill(gw.backend.pid(busy), signal.SIGKILL)
            served = load.outcomes.ok
            wait_for(lambda: load.outcomes.ok >= served + 12, 90, "requests after the kill to succeed")
        finally:
            outcomes = load.stop()
        # Only streams that had already sent data may end with an error event; nothing else fails.
        assert outcomes.failures == [], outcomes.failures
        assert all("replica_" in detail for detail in outcomes.broken_mid_stream), outcomes.broken_mid_stream
        assert any(r.replica_id == busy and r.exit_code == -signal.SIGKILL for r in gw.backend.exited)
        # The killed replica had >= 2 requests: each was re-run elsewhere, or (if streaming) resumed elsewhere.
        resumed = metric(gw.metrics(), "tandem:gateway_resumes_total", variant="fast", reason="unreachable")
        assert total_retries(gw.metrics()) + resumed + len(outcomes.broken_mid_stream) >= 1
        gw.wait_ready("fast", count=2, timeout=60)  # the controller replaced it
    finally:
        gw.stop()


@pytest.mark.slow
def test_a_rollout_under_load_fails_no_request(serve_model_dir, tmp_path):
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [variant("fast")],
        "policy": {"name": "hpa", "interval_s": 0.5, "params": {"target": 100}},
        "controller": {"drain_timeout_s": 30},
    }
    gw = RunningGateway(raw, tmp_path / "logs", api_key="op-key")
    auth = {"Authorization": "Bearer op-key"}
    try:
        gw.wait_ready("fast")
        load = Load(gw.url, workers=4, stream=lambda n: n % 2 == 0, max_tokens=24, headers=auth)
        try:
            wait_for(lambda: load.outcomes.ok >= 4, 60, "the load to get going")
            accepted = httpx.post(gw.url + "/admin/use", json={"recipe": "int8"}, headers=auth, timeout=30)
            assert accepted.status_code == 202, accepted.text
            assert accepted.json()["rollout"]["new"] == "int8"

            def phase() -> str:
                return httpx.get(gw.url + "/admin/rollout", headers=auth, timeout=10).json()["rollout"]["phase"]

            wait_for(lambda: phase() == Phase.DONE, 120, "the rollout to finish")
            wait_for(lambda: {r.variant for r in gw.backend.list()} == {"int8"}, 60, "the old variant to drain")
            served = load.outcomes.ok
            wait_for(lambda: load.outcomes.ok >= served + 4, 60, "requests on the new variant")
        finally:
            outcomes = load.stop()
        assert outcomes.failures == [] and outcomes.broken_mid_stream == []
        assert gw.gw.fleet.controller.primary == "int8" and gw.errors() == 0
        replicas = httpx.get(gw.url + "/admin/replicas", headers=auth, timeout=10).json()["replicas"]
        assert {(r["variant"], r["recipe"], r["state"]) for r in replicas} == {("int8", "int8", "ready")}
        gw.settled()
        assert all(r.exit_code == 0 for r in gw.backend.exited if r.variant == "fast")
        assert httpx.get(gw.url + "/ready", timeout=10).status_code == 200
    finally:
        gw.stop()
