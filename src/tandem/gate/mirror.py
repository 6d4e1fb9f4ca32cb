"""Shadow mirroring: copies of live requests sent to the candidate, answers kept for the gate only.

The gateway calls `offer(path, body, headers)` when a request arrives: it decides at once (a
sampled fraction, only while the gate is shadowing) and returns a Ticket or None, never waiting
on anything, so the client's answer is never delayed. A bounded queue feeds a few workers; when
it is full the mirror is dropped and counted. A worker sends the copy to a candidate replica
(the client's sampling parameters unchanged), records the answer, waits for the gateway to
report the incumbent's Observation through the ticket, scores the pair's accuracy (a random
`score_fraction` of the pairs, decided at arrival: scoring costs the serving path a request on each
side, and accuracy needs tens of scored pairs where latency needs every one) and hands the Pair to
`record`. `ticket.cancel()` (the client went away) abandons the mirror, in flight or not.

Side effects come in as arguments: the httpx client (its transport: a real one, or
httpx.MockTransport in tests), where the candidate and incumbent replicas are, the clock, the
sampler.

The gateway's side, per request (the incumbent's timings are taken where the gateway relays them):

    ticket = mirror.offer(path, body_bytes, forwarded_headers)       # None: not mirrored
    recorder = ResponseRecorder(clock(), stream)                       # anew for each attempt
    recorder.status(upstream.status_code); recorder.feed(chunk, clock())  # per relayed chunk
    ticket.incumbent_done(recorder.finish(clock()))                    # the client has it all
    ticket.cancel()                                                    # the client went away
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from tandem.gate.pairs import Pair, Sampling
from tandem.gate.scoring import Kept, Scorer
from tandem.measure.observation import Observation, observe

__all__ = ["ShadowMirror", "Ticket", "MIRRORED_PATHS"]

logger = logging.getLogger("tandem.gate")

MIRRORED_PATHS = ("/v1/completions", "/v1/chat/completions")
FORWARDED_HEADERS = ("authorization", "accept", "x-request-id")  # the copy's body differs: no length, no encoding


class Ticket:
    """One mirrored request. The gateway reports the incumbent's side through it, or cancels it."""

    def __init__(self, request_id: str, path: str, body: dict[str, Any], headers: Mapping[str, str], at: float) -> None:
        self.request_id, self.path, self.body, self.headers, self.at = request_id, path, body, dict(headers), at
        self.sampling = Sampling.from_body(body)
        self.incumbent: asyncio.Future[Observation] = asyncio.get_running_loop().create_future()
        self.cancelled = False
        self.task: asyncio.Task | None = None  # the candidate's request, while in flight
        self.kept: Kept | None = None  # where the incumbent's replica kept its track, if it was asked to
        self.scored = True  # scored for accuracy (decided at arrival: a random share of the pairs)

    def incumbent_done(self, observation: Observation, kept: Kept | None = None) -> None:
        """The incumbent's answer, once the client has it in full (and where its track was kept)."""
        if not self.incumbent.done():
            self.kept = kept
            self.incumbent.set_result(observation)

    def cancel(self) -> None:
        """The client went away: abandon the mirror (a queued one is skipped, one in flight is cancelled)."""
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()
        if not self.incumbent.done():
            self.incumbent.cancel()


class ShadowMirror:
    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        candidate_url: Callable[[], str | None],
        incumbent_url: Callable[[], str | None],
        record: Callable[[Pair], None],
        fraction: float = 1.0,
        queue_size: int = 64,
        concurrency: int = 4,
        enabled: Callable[[], bool] = lambda: True,
        sample: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
        scorer: Scorer | None = None,
        score: bool = True,
        score_fraction: float = 1.0,
        incumbent_timeout_s: float = 600.0,
    ) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f"the shadow fraction must be in (0, 1] (got {fraction})")
        self.client = client
        self.candidate_url, self.incumbent_url, self.record = candidate_url, incumbent_url, record
        self.fraction, self.enabled, self.sample, self.clock = fraction, enabled, sample, clock
        self.scorer = scorer or Scorer(client)
        self.score = score  # False: pairs are recorded unscored (the offline gate scores after the last one)
        self.score_fraction = score_fraction  # the share of pairs scored (the rest: latency and errors only)
        self.incumbent_timeout_s = incumbent_timeout_s
        self.concurrency = concurrency
        self.counts: Counter[str] = Counter()  # offered, mirrored, dropped, skipped, cancelled, no_replica, ...
        self._queue: asyncio.Queue[Ticket] = asyncio.Queue(maxsize=queue_size)
        self._workers: list[asyncio.Task] = []
        self._ids = itertools.count(1)

    # --- the gateway's side (called on its event loop; returns at once) ----------------------------
    def offer(
        self, path: str, body: bytes | Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> Ticket | None:
        """A Ticket when this request is mirrored, None when it is not (not sampled, unsupported, dropped)."""
        self.counts["offered"] += 1
        if not self.enabled() or self.sample() >= self.fraction:
            return None
        payload = body
        if isinstance(body, bytes | bytearray):
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
        if path not in MIRRORED_PATHS or not isinstance(payload, Mapping) or payload.get("n", 1) != 1:
            self.counts["skipped"] += 1  # the gate pairs single-choice completions only
            return None
        kept = {k.lower(): v for k, v in (headers or {}).items() if k.lower() in FORWARDED_HEADERS}
        request_id = kept.get("x-request-id") or f"shadow-{next(self._ids)}"
        ticket = Ticket(request_id, path, dict(payload), kept, self.clock())
        try:
            self._queue.put_nowait(ticket)
        except asyncio.QueueFull:
            self.counts["dropped"] += 1
            return None
        self.counts["mirrored"] += 1
        if self.score and self.score_fraction < 1 and self.sample() >= self.score_fraction:
            ticket.scored = False
            self.counts["unscored"] += 1
        return ticket

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the workers (on the running event loop)."""
        if not self._workers:
            self._workers = [asyncio.create_task(self._work()) for _ in range(self.concurrency)]

    async def drain(self) -> None:
        """Until every queued and in-flight mirror is settled (the offline gate's end)."""
        await self._queue.join()

    async def aclose(self) -> None:
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        while not self._queue.empty():  # tickets nobody will work on any more
            self._queue.get_nowait().cancel()
            self._queue.task_done()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    # --- the workers -----------------------------------------------------------------------------
    async def _work(self) -> None:
        while True:
            ticket = await self._queue.get()
            try:
                await self._mirror(ticket)
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if me is not None and me.cancelling():
                    ticket.cancel()
                    raise  # the mirror is closing
                self.counts["cancelled"] += 1  # the client went away
            except Exception:  # a bug here must not stop the workers; the pair is lost, and counted
                logger.exception("mirroring %s failed", ticket.request_id)
                self.counts["failed"] += 1
            finally:
                self._queue.task_done()

    def _candidate_body(self, ticket: Ticket) -> bytes:
        body = dict(ticket.body)
        if body.get("stream") is True:  # exact token counts for TPOT; the candidate's output is unchanged
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return json.dumps(body).encode()

    async def _mirror(self, ticket: Ticket) -> None:
        if ticket.cancelled:
            raise asyncio.CancelledError
        url = self.candidate_url()
        if url is None:
            self.counts["no_replica"] += 1
            ticket.cancel()
            return
        headers = {**ticket.headers, "content-type": "application/json"}
        ticket.task = asyncio.create_task(
            observe(
                self.client, url + ticket.path, self._candidate_body(ticket),
                headers=headers, clock=self.clock, stream=ticket.sampling.stream,
            )
        )  # fmt: skip
        candidate = await ticket.task
        ticket.task = None
        try:
            incumbent = await asyncio.wait_for(asyncio.shield(ticket.incumbent), self.incumbent_timeout_s)
        except TimeoutError:
            self.counts["orphaned"] += 1  # the gateway never reported the incumbent's side
            return
        agreement, note = None, None if ticket.scored else "not in the share of pairs scored for accuracy"
        if self.score and ticket.scored and incumbent.ok and candidate.ok:
            agreement, note = await self.scorer.agreement(
                ticket.path, ticket.body, incumbent, candidate,
                incumbent_url=self.incumbent_url(), candidate_url=url, headers=ticket.headers,
                greedy=ticket.sampling.greedy, kept=ticket.kept,
            )  # fmt: skip
        pair = Pair(ticket.request_id, ticket.path, ticket.at, ticket.sampling, incumbent, candidate, agreement, note)
        if pair.candidate_failed:
            self.counts["candidate_errors"] += 1
        self.counts["paired"] += 1
        self.record(pair)  # an error here is logged and counted by _work
