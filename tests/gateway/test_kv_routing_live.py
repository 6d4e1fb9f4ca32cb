"""The kv-aware router with real replicas: two `tandem serve` replicas that keep a block cache and
publish it (GET /kv/events), one gateway. A prompt's prefix follows the replica that holds it,
unless that replica is saturated; a replica that restarts is resynced (its old entries dropped)."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import pytest

from .harness import MODEL_NAME, RunningGateway, variant, wait_for

PREFIX = "def handle(request):\n    " + "value = compute(value, request)\n    " * 24  # ~300 tokens
SATURATION = 3


@pytest.fixture(scope="module")
def gateway(serve_model_dir, tmp_path_factory):
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [variant("main", lo=2, hi=2)],
        "policy": {"name": "hpa", "interval_s": 0.5, "params": {"target": 100}},
        "router": {"name": "kv-aware", "params": {"queued_request_tokens": 64, "saturation": SATURATION}},
    }
    gw = RunningGateway(raw, tmp_path_factory.mktemp("kv-live") / "logs")
    try:
        gw.wait_ready("main", 2)
        yield gw
    finally:
        gw.stop()


def complete(gw: RunningGateway, prompt: str, max_tokens: int = 4) -> None:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    assert httpx.post(gw.url + "/v1/completions", json=body, timeout=60).status_code == 200


def holding(gw: RunningGateway, prompt: str) -> dict[str, int]:
    """Per replica, the leading tokens of `prompt` the gateway's index says it holds."""
    replica = gw.backend.list()[0]
    ids = httpx.post(replica.url + "/tokenize", json={"prompt": prompt}, timeout=10,
                     headers={"Authorization": f"Bearer {gw.fleet_secret}"}).json()["tokens"]  # fmt: skip
    return dict(gw.gw.fleet.kv.match(ids).cached_tokens)


def test_a_shared_prefix_follows_its_holder_unless_it_is_saturated_and_a_restart_is_resynced(gateway):
    gw = gateway
    complete(gw, PREFIX + "# first\n")
    held = wait_for(
        lambda: {r: n for r, n in holding(gw, PREFIX).items() if n > 0}, 15, "the index to learn the prefix"
    )
    assert len(held) == 1, held
    holder = next(iter(held))
    other = next(r.replica_id for r in gw.backend.list() if r.replica_id != holder)
    for i in range(3):
        complete(gw, PREFIX + f"# request {i}\n")
    wait_for(lambda: gw.gw.fleet.kv.since(holder) > 0, 5, "events read")
    assert holding(gw, PREFIX).get(other, 0) == 0, "a request with the prefix went to the replica without it"

    # The holder is saturated by long requests from elsewhere: the prefix goes to the other replica.
    url = next(r.url for r in gw.backend.list() if r.replica_id == holder)
    stop = threading.Event()

    def hog(n: int) -> None:
        body = {"model": MODEL_NAME, "prompt": f"other {n}", "max_tokens": 900, "ignore_eos": True, "stream": True}
        headers = {"Authorization": f"Bearer {gw.fleet_secret}"}
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=120) as r:
            for _ in r.iter_raw():
                if stop.is_set():
                    return

    hogs = [threading.Thread(target=hog, args=(n,), daemon=True) for n in range(SATURATION)]
    for t in hogs:
        t.start()
    try:
        wait_for(lambda: any(x.replica_id == holder and x.running >= SATURATION for x in gw.gw.dispatcher.loads()),
                 30, "the holder to report itself saturated")  # fmt: skip
        complete(gw, PREFIX + "# while it is busy\n")
        wait_for(lambda: holding(gw, PREFIX).get(other, 0) > 0, 15, "the other replica to take the prefix")
    finally:
        stop.set()
        for t in hogs:
            t.join(30)

    # The holder dies and is restarted under a new id: its entries go, the new one starts empty.
    os.kill(gw.backend.pid(holder), signal.SIGKILL)
    wait_for(lambda: holder not in gw.gw.fleet.kv.publishing(), 30, "the dead replica's entries to go")
    gw.wait_ready("main", 2, timeout=120)
    fresh = next(r.replica_id for r in gw.backend.list() if r.replica_id not in (holder, other))
    wait_for(lambda: fresh in gw.gw.fleet.kv.publishing(), 15, "the new replica's feed")
    assert holding(gw, PREFIX).get(fresh, 0) == 0
