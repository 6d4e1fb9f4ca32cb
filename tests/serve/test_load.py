"""GET /load: a replica's own ReplicaLoad (running, waiting, KV fraction in use, healthy), moving with its load."""

from __future__ import annotations

import threading
import time

import httpx

from .conftest import MODEL_NAME

LONG = {"model": MODEL_NAME, "prompt": "a", "max_tokens": 600, "ignore_eos": True, "stream": True}


def _load(server) -> dict:
    return httpx.get(server.url + "/load", timeout=10).json()


def test_load_reports_what_runs_and_waits_and_the_kv_in_use(server):
    idle = _load(server)
    assert idle == {
        "replica_id": f"127.0.0.1:{server.port}", "region": "local", "variant": "baseline",
        "running": 0, "waiting": 0, "kv_used": 0.0, "healthy": True, "source": "tandem", "prefill_tokens": 0,
        "block_size": 16, "hash_seed": 0,
    }  # fmt: skip
    stop = threading.Event()
    started = threading.Semaphore(0)

    def stream() -> None:  # runs (holding its KV blocks) until told to leave
        with httpx.stream("POST", server.url + "/v1/completions", json=LONG, timeout=60) as response:
            for _ in response.iter_lines():
                started.release()
                if stop.is_set():
                    return

    clients = [threading.Thread(target=stream, daemon=True) for _ in range(10)]  # 8 slots: 2 must wait
    for client in clients:
        client.start()
    try:
        deadline, busy = time.monotonic() + 60, idle
        while not (busy["running"] == 8 and busy["waiting"] == 2):
            assert time.monotonic() < deadline, f"never saw 8 running and 2 waiting: {busy}"
            busy = _load(server)
        # The blocks the eight short sequences hold, not their slots: a small fraction of the pool.
        assert 0.0 < busy["kv_used"] < 0.5 and busy["healthy"]
    finally:
        stop.set()
        for client in clients:
            client.join(60)
    deadline = time.monotonic() + 30
    while (after := _load(server))["running"] + after["waiting"]:  # the clients left: their slots were freed
        assert time.monotonic() < deadline, after
    assert after["kv_used"] == 0.0
