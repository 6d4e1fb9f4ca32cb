"""The gateway's KV feed in process: fake replicas (an httpx MockTransport) that tokenize, keep a block
cache and publish it on GET /kv/events; the kv-aware gateway routes a shared prefix to its holder."""

from __future__ import annotations

import asyncio

import httpx

from tandem.cluster.fake import FakeBackend
from tandem.contracts import KV_EVENTS_PATH, KVEvents, kv_block_hashes
from tandem.deployment import parse_deployment
from tandem.gateway.app import create_gateway_app
from tandem.gateway.kv_feed import poll_kv_events, prompt_ids
from tandem.gateway.loads import poll_loads
from tandem.gateway.wiring import Gateway, build_gateway

BLOCK, SEED = 4, 3
SECRET = "s3cret"
SYSTEM = "You are a careful assistant." * 4  # 112 characters: 28 blocks of 4


class FakeKVReplica:
    """Tokenizes one id per character, caches every full block it prefills, keeps its last 16 events."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.blocks: set[int] = set()
        self.log: list[tuple[int, int]] = []  # (seq, hash) stored
        self.seq = 0
        self.running = 0
        self.asked: list[int] = []
        self.resets = True  # False: answers a `since` it never had as if it had (a replica that restarted blind)

    def tokenize(self, body: dict) -> list[int]:
        text = body.get("prompt") or "".join(m["content"] for m in body["messages"])
        return [ord(c) for c in text]

    def prefill(self, ids: list[int]) -> None:
        for h in kv_block_hashes(ids, BLOCK, SEED):
            if h not in self.blocks:
                self.blocks.add(h)
                self.seq += 1
                self.log.append((self.seq, h))

    def events(self, since: int) -> KVEvents:
        self.asked.append(since)
        kept = self.log[-16:]
        if (self.resets and since > self.seq) or (kept and since < kept[0][0] - 1):
            return KVEvents(self.seq, BLOCK, SEED, True, tuple(self.blocks))
        return KVEvents(self.seq, BLOCK, SEED, False, tuple(h for s, h in kept if s > since))

    def handle(self, request: httpx.Request) -> httpx.Response:
        import json

        assert request.headers.get("authorization") == f"Bearer {SECRET}"
        path = request.url.path
        if path == "/load":
            return httpx.Response(
                200, json={"replica_id": self.replica_id, "running": self.running, "waiting": 0, "kv_used": 0.1,
                           "healthy": True, "block_size": BLOCK, "hash_seed": SEED},
            )  # fmt: skip
        if path == KV_EVENTS_PATH:
            return httpx.Response(200, json=self.events(int(request.url.params["since"])).to_json())
        body = json.loads(request.content)
        if path == "/tokenize":
            ids = self.tokenize(body)
            return httpx.Response(200, json={"tokens": ids, "count": len(ids)})
        self.prefill(self.tokenize(body))
        return httpx.Response(200, json={"choices": [{"text": "ok"}], "usage": {"prompt_tokens": 1}})


def _gateway(router: dict, replicas: dict[str, FakeKVReplica] | None = None) -> tuple[Gateway, dict]:
    replicas = {} if replicas is None else replicas

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host not in replicas:
            replicas[host] = FakeKVReplica(host)
        return replicas[host].handle(request)

    raw = {
        "variants": [{"name": "v", "recipe": "baseline", "replicas": {"min": 2, "max": 2}}],
        "router": router,
        "policy": {"name": "hpa"},
    }
    gw = build_gateway(
        parse_deployment(raw), FakeBackend(clock=lambda: 0.0), transport=httpx.MockTransport(handler),
        fleet_secret=SECRET,
    )  # fmt: skip
    gw.fleet.controller.tick()
    gw.fleet.controller.tick()
    return gw, replicas


async def _session(gw: Gateway, bodies: list[tuple[str, dict]]) -> None:
    """Poll, then each request in turn, polling (loads and KV events) after each."""
    app = create_gateway_app(gw)
    gw.upstream.open()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw") as client:
        await poll_loads(gw.fleet, gw.upstream)
        for path, body in bodies:
            assert (await client.post(path, json=body)).status_code == 200
            await poll_loads(gw.fleet, gw.upstream)
    await gw.upstream.aclose()
    gw.upstream.client = None  # the next session runs on another event loop


def test_the_deployment_names_the_router_and_the_gateway_keeps_an_index_only_for_it():
    assert _gateway({"name": "kv-aware"})[0].fleet.kv is not None
    assert _gateway({"name": "least-outstanding"})[0].fleet.kv is None


def test_requests_sharing_a_prefix_follow_the_replica_that_holds_it():
    gw, replicas = _gateway({"name": "kv-aware", "params": {"queued_request_tokens": 8}})
    asyncio.run(_session(gw, [("/v1/completions", {"model": "m", "prompt": SYSTEM + "hello"})]))
    holder = next(r for r in replicas.values() if r.blocks)
    assert gw.fleet.kv.blocks(holder.replica_id) == len(holder.blocks) == 29  # 117 characters
    # Its neighbour is idle, the holder has one request running from elsewhere: the prefix still wins.
    holder.running = 1
    chats = [("/v1/chat/completions", {"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                                                  {"role": "user", "content": f"q{i}"}]})
             for i in range(3)]  # fmt: skip
    asyncio.run(_session(gw, chats))
    other = next(r for r in replicas.values() if r is not holder)
    assert not other.blocks, "the shared prefix went to the replica without it"
    assert gw.fleet.kv.match([ord(c) for c in SYSTEM]).cached_tokens[holder.replica_id] == 112


def test_a_busy_holder_loses_the_request_to_an_idle_replica():
    gw, replicas = _gateway({"name": "kv-aware", "params": {"queued_request_tokens": 8}})
    asyncio.run(_session(gw, [("/v1/completions", {"model": "m", "prompt": SYSTEM})]))
    holder = next(r for r in replicas.values() if r.blocks)
    holder.running = 20  # 20 x 8 queued tokens > the 112 it would save
    asyncio.run(_session(gw, [("/v1/completions", {"model": "m", "prompt": SYSTEM + "x"})]))
    assert all(r.blocks for r in replicas.values())


def test_a_gap_in_the_feed_is_a_full_resync_and_a_replica_that_leaves_is_forgotten():
    gw, replicas = _gateway({"name": "kv-aware"})
    live = gw.fleet.backend.list()

    async def poll() -> None:
        async with httpx.AsyncClient(
            transport=gw.upstream.transport, headers={"Authorization": f"Bearer {SECRET}"}
        ) as c:
            await poll_kv_events(c, gw.fleet.backend.list(), gw.fleet.kv)

    asyncio.run(poll())
    a = replicas[live[0].replica_id]
    a.prefill(list(range(400)))  # 100 blocks: more than its log keeps, so ?since=0 is answered with a reset
    asyncio.run(poll())
    assert gw.fleet.kv.blocks(a.replica_id) == 100 and gw.fleet.kv.since(a.replica_id) == 100
    # It restarts under the same address and says so (a reset): what it holds now replaces what it held.
    a.blocks, a.log, a.seq = set(), [], 0
    a.prefill(list(range(8)))
    asyncio.run(poll())
    assert a.asked[-1] == 100 and gw.fleet.kv.blocks(a.replica_id) == 2 and gw.fleet.kv.resyncs == 0
    # Again, without saying so: its counter went back, so the index drops it and resyncs from 0 at once.
    a.blocks, a.log, a.seq, a.resets = set(), [], 0, False
    a.prefill(list(range(4)))
    asyncio.run(poll())
    assert a.asked[-2:] == [2, 0]
    assert gw.fleet.kv.blocks(a.replica_id) == 1 and gw.fleet.kv.resyncs == 1
    gw.fleet.backend.stop(a.replica_id)
    asyncio.run(poll())
    assert a.replica_id not in gw.fleet.kv.publishing()


def test_prompts_are_tokenized_once_by_a_replica_or_taken_as_given():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(200, json={"tokens": [5, 6, 7], "count": 3})

    async def ask(payload) -> list[int] | None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await prompt_ids(client, "http://r", payload)

    assert asyncio.run(ask({"prompt": [1, 2, 3]})) == [1, 2, 3] and calls == []
    assert asyncio.run(ask({"prompt": [[4, 5], [6]]})) == [4, 5]
    assert asyncio.run(ask({"prompt": "text"})) == [5, 6, 7]
    assert asyncio.run(ask({"messages": [{"role": "user", "content": "hi"}]})) == [5, 6, 7]
    assert asyncio.run(ask({"input": "nothing to tokenize"})) is None
    assert calls == ["/tokenize", "/tokenize"]
