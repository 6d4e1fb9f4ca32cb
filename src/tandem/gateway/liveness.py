"""Per-request deadlines at the gateway, and replicas declared unresponsive: liveness judges replicas, not requests.

A replica that stops (SIGSTOP, a wedged process, a machine that froze) still accepts TCP
connections (the kernel queues them), so without deadlines its requests hang until the read
timeout. Two deadlines, from the settings:
- `first_byte_timeout`: a stream's first chunk. A non-streaming answer comes whole (its first
  byte is its last), so there the deadline does not cut a long generation: it asks the replica
  `GET /health` (`probe`), and keeps waiting, period after period, while it answers.
- `stream_idle_timeout`: the longest pause between a stream's chunks.

A missed deadline is first a fact about one request: its first chunk may be legitimately late (a
long stop string holding text back, a slow logits processor, a deep queue). So the replica is
judged on its own evidence, in this order:
- it stopped making progress on every stream: another of its streams is waiting for a chunk too
  and no request on it made progress (a chunk, an answer) for as long as this deadline: declared;
- it does not answer its health probe within the probe's timeout: declared;
- else it is alive and serving others: this request alone times out (`RequestTimeout`); the
  proxy answers it 504 or retries it once elsewhere, its neighbours are untouched, the replica
  stays routed and the breaker is not told (it is no failure of the variant).
A *declared* replica is skipped by routing at once (until its next GET /load answers,
tandem.gateway.loads), and every request waiting on it gives up at once too (the deadlines they
wait under are moved to now), so requests that had not started streaming are re-run elsewhere and
streams end with an error event and `data: [DONE]` (tandem.gateway.proxy).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

__all__ = ["Liveness", "RequestTimeout", "Unresponsive"]

logger = logging.getLogger("tandem.gateway")

T = TypeVar("T")


class Unresponsive(Exception):
    """The replica missed a deadline (or was declared unresponsive by another request meanwhile)."""

    def __init__(self, replica_id: str, why: str) -> None:
        super().__init__(f"replica {replica_id} is unresponsive: {why}")
        self.replica_id, self.why = replica_id, why


class RequestTimeout(Exception):
    """One request missed its deadline on a replica that is alive and serving others: it alone gives up."""

    def __init__(self, replica_id: str, what: str, seconds: float) -> None:
        super().__init__(f"no {what} within {seconds:g} s from replica {replica_id}, which serves its other requests")
        self.replica_id, self.what, self.seconds = replica_id, what, seconds


Probe = Callable[[], Awaitable[bool]]
MID_STREAM = "stream chunk"  # what a stream past its first chunk waits for (see `stalled`)


class Liveness:
    """Which replicas were declared unresponsive, and the requests waiting on each.

    `on_declare(replica_id)` takes the replica out of routing (the gateway: InFlight.mark_unreachable
    until revived); `on_revive(replica_id)` puts it back. Use from the event loop only.
    """

    def __init__(
        self,
        on_declare: Callable[[str], None] = lambda replica_id: None,
        on_revive: Callable[[str], None] = lambda replica_id: None,
    ) -> None:
        self.on_declare, self.on_revive = on_declare, on_revive
        self.unresponsive: dict[str, str] = {}  # replica id -> why
        self._deadlines: defaultdict[str, dict[asyncio.Timeout, str]] = defaultdict(dict)  # -> what each waits for
        self._events: dict[str, asyncio.Event] = {}
        self._progress: dict[str, float] = {}  # replica id -> loop time of its last chunk or answer

    def progress(self, replica_id: str) -> None:
        """A request on the replica made progress (a chunk came, an answer came)."""
        self._progress[replica_id] = asyncio.get_running_loop().time()

    def stalled(self, replica_id: str, seconds: float) -> int:
        """How many of the replica's other streams wait for a chunk while nothing on it made progress for
        `seconds` (0: it is not stalled, or there is no other stream to judge by)."""
        now = asyncio.get_running_loop().time()
        if now - self._progress.get(replica_id, -math.inf) < seconds:
            return 0
        return sum(what == MID_STREAM for what in self._deadlines.get(replica_id, {}).values())

    def declare(self, replica_id: str, why: str) -> None:
        if replica_id in self.unresponsive:
            return
        self.unresponsive[replica_id] = why
        logger.warning("replica %s is unresponsive (%s): routing skips it; its waiting requests move", replica_id, why)
        self.on_declare(replica_id)
        now = asyncio.get_running_loop().time()
        for deadline in list(self._deadlines.get(replica_id, ())):
            if not deadline.expired():
                deadline.reschedule(now)
        if replica_id in self._events:
            self._events[replica_id].set()

    def revive(self, replica_id: str) -> None:
        """The replica answered again (a GET /load poll): route to it again."""
        if self.unresponsive.pop(replica_id, None) is not None:
            logger.info("replica %s answers again", replica_id)
            self.on_revive(replica_id)
        self._events.pop(replica_id, None)

    def forget(self, live: list[str]) -> None:
        """Drop what is known of replicas no longer in the fleet (stopped, replaced)."""
        for replica_id in [r for r in self.unresponsive if r not in live]:
            del self.unresponsive[replica_id]
            self.on_revive(replica_id)  # nothing left to skip
        for replica_id in [r for r in self._events if r not in live]:
            del self._events[replica_id]
        for replica_id in [r for r in self._progress if r not in live]:
            del self._progress[replica_id]

    @asynccontextmanager
    async def deadline(
        self, replica_id: str, seconds: float, what: str, probe: Probe | None = None
    ) -> AsyncIterator[None]:
        """Raise if the block does not finish within `seconds`: RequestTimeout when the replica is alive
        (its health `probe` answers and it is not stalled), else Unresponsive, declaring it. Without a
        probe a missed deadline declares the replica. Raise Unresponsive as soon as another request
        declares it so."""
        if replica_id in self.unresponsive:
            raise Unresponsive(replica_id, self.unresponsive[replica_id])
        try:
            async with asyncio.timeout(seconds) as timeout:
                self._deadlines[replica_id][timeout] = what
                try:
                    yield
                finally:
                    self._forget(replica_id, timeout)
        except TimeoutError:
            if not timeout.expired():
                raise  # the block's own TimeoutError, not ours
            if replica_id in self.unresponsive:  # declared meanwhile (our deadline was moved to now)
                raise Unresponsive(replica_id, self.unresponsive[replica_id]) from None
            why = await self._judge(replica_id, seconds, what, probe)
            if why is None:
                raise RequestTimeout(replica_id, what, seconds) from None
            self.declare(replica_id, why)
            raise Unresponsive(replica_id, self.unresponsive.get(replica_id, why)) from None

    async def _judge(self, replica_id: str, seconds: float, what: str, probe: Probe | None) -> str | None:
        """Why the replica is unresponsive, now that one request missed its deadline; None: it is not."""
        stalled = self.stalled(replica_id, seconds)
        if stalled:
            return f"no {what} within {seconds:g} s and no progress on any of its {stalled + 1} streams"
        if probe is None:
            return f"no {what} within {seconds:g} s"
        if not await probe():
            return f"no {what} within {seconds:g} s and no answer to its health probe"
        return None

    async def answer(
        self, replica_id: str, work: Awaitable[T], seconds: float, probe: Callable[[], Awaitable[bool]]
    ) -> T:
        """Await `work` (a whole non-streaming answer). Every `seconds` without it, `probe()` the replica:
        while it answers, keep waiting; once it does not, declare it unresponsive and raise."""
        if replica_id in self.unresponsive:
            raise Unresponsive(replica_id, self.unresponsive[replica_id])
        task = asyncio.ensure_future(work)
        event = self._events.setdefault(replica_id, asyncio.Event())
        declared = asyncio.ensure_future(event.wait())
        try:
            while True:
                done, _ = await asyncio.wait({task, declared}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    if not task.cancelled() and task.exception() is None:
                        self.progress(replica_id)
                    return task.result()
                if declared in done or replica_id in self.unresponsive:
                    raise Unresponsive(replica_id, self.unresponsive.get(replica_id, "declared"))
                if not await probe():
                    self.declare(replica_id, f"no answer within {seconds:g} s and no answer to GET /health")
                    raise Unresponsive(replica_id, self.unresponsive[replica_id])
        finally:
            for pending in (task, declared):
                pending.cancel()
            await asyncio.gather(task, declared, return_exceptions=True)

    def _forget(self, replica_id: str, timeout: asyncio.Timeout) -> None:
        deadlines = self._deadlines.get(replica_id)
        if deadlines is not None:
            deadlines.pop(timeout, None)
            if not deadlines:
                del self._deadlines[replica_id]
