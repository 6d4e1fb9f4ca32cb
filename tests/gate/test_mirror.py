"""The shadow mirror on httpx.MockTransport: copies go to the candidate with the client's parameters,
never delay the client, are bounded (full queue: dropped and counted), die with the client's
connection, and become Pairs."""

import asyncio
import json

import httpx
from completion_events import completion_chunk, sse, usage_chunk

from tandem.gate.mirror import ShadowMirror
from tandem.measure.observation import Observation

BODY = {"model": "m", "prompt": "def f():", "max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "seed": 7,
        "stream": True, "logprobs": 1}  # fmt: skip
ANSWER = sse(completion_chunk("a", tokens=["a"]), completion_chunk("b", tokens=["b"]), usage_chunk(2), "[DONE]")
INCUMBENT = Observation(200, None, 0.3, 0.1, 0.05, 2, "ab", "length")


class Candidate:
    """A candidate replica: answers at once, or holds every request until `release` is set."""

    def __init__(self, hold: bool = False, status: int = 200) -> None:
        self.hold, self.status = hold, status
        self.release = asyncio.Event()
        self.received: list[dict] = []
        self.headers: list[httpx.Headers] = []
        self.cancelled = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.received.append(json.loads(request.content))
        self.headers.append(request.headers)
        if self.hold:
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "boom"}})
        return httpx.Response(200, content=ANSWER)


def mirror_for(candidate, client, **kwargs):
    pairs = []
    kwargs.setdefault("score", False)
    mirror = ShadowMirror(
        client, candidate_url=lambda: "http://cand", incumbent_url=lambda: "http://inc", record=pairs.append, **kwargs
    )
    return mirror, pairs


def run(coro):
    return asyncio.run(coro)


def test_a_mirrored_request_keeps_the_clients_parameters_and_becomes_a_pair():
    async def main():
        candidate = Candidate()
        async with httpx.AsyncClient(transport=httpx.MockTransport(candidate)) as client:
            mirror, pairs = mirror_for(candidate, client)
            mirror.start()
            headers = {"Authorization": "Bearer k", "content-length": "3", "x-request-id": "req-1"}
            ticket = mirror.offer("/v1/completions", json.dumps(BODY).encode(), headers)
            ticket.incumbent_done(INCUMBENT)
            await mirror.drain()
            await mirror.aclose()
        return candidate, mirror, pairs

    candidate, mirror, pairs = run(main())
    (sent,) = candidate.received
    assert sent == {**BODY, "stream_options": {"include_usage": True}}  # only usage added, for exact token counts
    assert candidate.headers[0]["authorization"] == "Bearer k"  # the copy's own length, not the original's
    assert int(candidate.headers[0]["content-length"]) > 3
    (pair,) = pairs
    assert pair.request_id == "req-1"
    assert pair.incumbent == INCUMBENT and pair.candidate.text == "ab" and pair.candidate.completion_tokens == 2
    assert pair.sampling.temperature == 0.7 and pair.sampling.seed == 7 and not pair.sampling.greedy
    assert mirror.counts["mirrored"] == 1 and mirror.counts["paired"] == 1


def test_the_client_never_waits_for_the_mirror_and_a_full_queue_drops():
    async def main():
        candidate = Candidate(hold=True)
        async with httpx.AsyncClient(transport=httpx.MockTransport(candidate)) as client:
            mirror, pairs = mirror_for(candidate, client, queue_size=2, concurrency=1)
            mirror.start()
            tickets = [mirror.offer("/v1/completions", BODY)]
            while not candidate.received:  # the worker took the first copy to the candidate, which holds it
                await asyncio.sleep(0)
            tickets += [mirror.offer("/v1/completions", BODY) for _ in range(3)]  # each returns at once
            for t in tickets:
                if t is not None:
                    t.incumbent_done(INCUMBENT)  # the clients all have their answers ...
            held = len(candidate.received)  # ... while the candidate still holds the first copy
            candidate.release.set()
            await mirror.drain()
            await mirror.aclose()
        return tickets, held, mirror, pairs

    tickets, held, mirror, pairs = run(main())
    assert held == 1
    # one taken by the worker, two queued, the fourth dropped (counted, not waited for)
    assert sum(t is None for t in tickets) == 1
    assert mirror.counts["dropped"] == 1 and mirror.counts["mirrored"] == 3 and len(pairs) == 3


def test_a_client_that_disconnects_cancels_its_mirror_in_flight_and_in_the_queue():
    async def main():
        candidate = Candidate(hold=True)
        async with httpx.AsyncClient(transport=httpx.MockTransport(candidate)) as client:
            mirror, pairs = mirror_for(candidate, client, concurrency=1)
            mirror.start()
            first = mirror.offer("/v1/completions", BODY)
            second = mirror.offer("/v1/completions", BODY)
            while not candidate.received:
                await asyncio.sleep(0)
            first.cancel()  # in flight
            second.cancel()  # still queued: never sent
            await mirror.drain()
            await mirror.aclose()
        return candidate, mirror, pairs

    candidate, mirror, pairs = run(main())
    assert candidate.cancelled == 1 and len(candidate.received) == 1
    assert mirror.counts["cancelled"] == 2 and pairs == []


def test_sampling_fraction_and_the_gates_switch():
    async def main():
        candidate = Candidate()
        draws = iter([0.1, 0.5, 0.19, 0.2])
        async with httpx.AsyncClient(transport=httpx.MockTransport(candidate)) as client:
            shadowing = [True]
            mirror, _ = mirror_for(
                candidate, client, fraction=0.2, sample=lambda: next(draws), enabled=lambda: shadowing[0]
            )
            picked = [mirror.offer("/v1/completions", BODY) is not None for _ in range(4)]
            shadowing[0] = False  # the gate decided: no more copies
            after = mirror.offer("/v1/completions", BODY)
            await mirror.aclose()
        return picked, after, mirror

    picked, after, mirror = run(main())
    assert picked == [True, False, True, False] and after is None and mirror.counts["offered"] == 5


def test_requests_the_gate_cannot_pair_are_skipped():
    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(Candidate())) as client:
            mirror, _ = mirror_for(None, client)
            out = [
                mirror.offer("/v1/completions", {**BODY, "n": 2}),
                mirror.offer("/v1/completions", b"not json"),
                mirror.offer("/v1/embeddings", BODY),
            ]
            await mirror.aclose()
        return out, mirror

    out, mirror = run(main())
    assert out == [None, None, None] and mirror.counts["skipped"] == 3


def test_candidate_failures_are_recorded_as_such():
    async def main():
        candidate = Candidate(status=500)
        async with httpx.AsyncClient(transport=httpx.MockTransport(candidate)) as client:
            mirror, pairs = mirror_for(candidate, client)
            mirror.start()
            mirror.offer("/v1/completions", BODY).incumbent_done(INCUMBENT)
            await mirror.drain()
            await mirror.aclose()
        return mirror, pairs

    mirror, (pair,) = run(main())
    assert pair.candidate_failed and pair.candidate.error == "HTTP 500: boom"
    assert mirror.counts["candidate_errors"] == 1


def test_no_candidate_replica_ready():
    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(Candidate())) as client:
            pairs = []
            mirror = ShadowMirror(client, candidate_url=lambda: None, incumbent_url=lambda: None, record=pairs.append)
            mirror.start()
            mirror.offer("/v1/completions", BODY)
            await mirror.drain()
            await mirror.aclose()
        return mirror, pairs

    mirror, pairs = run(main())
    assert mirror.counts["no_replica"] == 1 and pairs == []


def test_pairs_are_scored_inline_for_the_live_gate():
    echo = {"choices": [{"index": 0, "text": "p" + "ab", "logprobs": {
        "tokens": ["p", "a", "b"], "token_logprobs": [None, -0.1, -0.2],
        "top_logprobs": [None, {"a": -0.1}, {"b": -0.2}],
        "text_offset": [0, 1, 2]}}]}  # fmt: skip

    async def handler(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("echo"):
            return httpx.Response(200, json=echo)
        return httpx.Response(200, content=ANSWER)

    async def main():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            mirror, pairs = mirror_for(None, client, score=True)
            mirror.start()
            mirror.offer("/v1/completions", {**BODY, "prompt": "p"}).incumbent_done(INCUMBENT)
            await mirror.drain()
            await mirror.aclose()
        return pairs

    (pair,) = run(main())
    assert pair.agreement.method == "teacher-forced" and (pair.agreement.positions, pair.agreement.agree) == (2, 2)
