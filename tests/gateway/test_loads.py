"""Replicas' own loads, polled over GET /load, reach the router: with real replicas behind a real gateway,
a replica kept busy by clients that bypass the gateway is avoided, although the gateway itself sent
it nothing."""

from __future__ import annotations

import threading

import httpx
import pytest

from .harness import MODEL_NAME, RunningGateway, variant, wait_for

pytestmark = pytest.mark.slow

LONG = {"model": MODEL_NAME, "prompt": "a", "max_tokens": 1000, "ignore_eos": True, "stream": True}


class Streams:
    """`count` long streams to `url`, held open until `stop()`."""

    def __init__(self, url: str, count: int, token: str | None = None) -> None:
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.started = threading.Semaphore(0)
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._one, args=(url,), daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _one(self, url: str) -> None:
        with httpx.stream("POST", url + "/v1/completions", json=LONG, headers=self.headers, timeout=120) as response:
            first = True
            for _ in response.iter_lines():
                if first:
                    self.started.release()
                    first = False
                if self.stopped.is_set():
                    return

    def stop(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(60)


class Recording(httpx.AsyncBaseTransport):
    """The gateway's transport to its replicas, noting where each POST went."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.posts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.posts.append(f"http://{request.url.host}:{request.url.port}")
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_replica_saturated_from_elsewhere_is_avoided(serve_model_dir, tmp_path):
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [variant("fast", lo=2, hi=2)],
        "policy": {"name": "hpa", "interval_s": 0.25, "params": {"target": 100}},
    }
    transport = Recording()
    gw = RunningGateway(raw, tmp_path / "logs", transport=transport)
    try:
        gw.wait_ready("fast", count=2)
        busy, idle = sorted(gw.backend.list(), key=lambda r: r.replica_id)  # the router's tie-break favours `busy`
        direct = Streams(busy.url, 10, gw.fleet_secret)  # 8 slots: 8 run and 2 wait, none through the gateway
        try:

            def reported():
                report = gw.gw.fleet.inflight.reports.get(busy.replica_id)
                return report is not None and (report.load.running, report.load.waiting) == (8, 2) and report

            report = wait_for(reported, 60, "the busy replica's own report of 8 running and 2 waiting")
            # the gateway sent it nothing; its KV in use is the blocks its 8 running sequences hold
            assert 0.0 < report.load.kv_used < 1.0 and not gw.gw.fleet.inflight.running
            through = Streams(gw.url, 4)
            try:
                for _ in range(4):
                    assert through.started.acquire(timeout=60)
            finally:
                through.stop()
            assert transport.posts == [idle.url] * 4  # all on the idle replica
        finally:
            direct.stop()
        replicas = httpx.get(gw.url + "/admin/replicas", timeout=10).json()["replicas"]
        assert {r["id"] for r in replicas if r["load"] is not None} == {busy.replica_id, idle.replica_id}
    finally:
        gw.stop()
