"""GET /kv/events: the block hashes a replica's block cache stored, in the contract's hash chain with
the block size and seed GET /load reports; bad positions are 400s; the feed is behind the API key."""

from __future__ import annotations

import httpx

from tandem.contracts import KV_EVENTS_PATH, KVEvents, kv_block_hashes

from .conftest import API_KEY, MODEL_NAME


def _events(server, since: int) -> KVEvents:
    response = httpx.get(server.url + KV_EVENTS_PATH, params={"since": since}, timeout=10)
    assert response.status_code == 200, response.text
    return KVEvents.from_json(response.json())


def test_a_served_prompts_blocks_appear_in_the_feed_as_the_gateway_would_hash_them(server):
    load = httpx.get(server.url + "/load", timeout=10).json()
    size, seed = load["block_size"], load["hash_seed"]
    assert size == 16 and seed == 0
    start = _events(server, 0)
    assert start.reset and start.seq > 0  # a new reader: every block held, as a reset
    prompt = [0, *range(40, 40 + 70)]  # 71 tokens: four full blocks
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
    delta = _events(server, start.seq)
    assert not delta.reset and delta.seq > start.seq and (delta.block_size, delta.hash_seed) == (size, seed)
    assert set(kv_block_hashes(prompt, size, seed)) <= set(delta.stored)
    assert _events(server, delta.seq).stored == ()  # nothing new since


def test_a_position_that_is_not_an_event_number_is_a_400(server):
    for bad in ("-1", "soon", "1e3", str(2**64)):
        response = httpx.get(server.url + KV_EVENTS_PATH, params={"since": bad}, timeout=10)
        assert response.status_code == 400, bad
        assert response.json()["error"]["param"] == "since"


def test_the_feed_needs_the_api_key(guarded_server):
    url = guarded_server.url + KV_EVENTS_PATH
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10).status_code == 200
