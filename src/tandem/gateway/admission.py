"""Admission when the fleet is saturated: requests wait at the gateway in a FairQueue (priority, then
each tenant's virtual token counter: tandem.gateway.fair_queue) and take a replica in that order.

A replica is "full" at `max_inflight_per_replica` requests outstanding (the dispatcher's router is
wrapped in tandem.schedule.routers.AdmissionCap), so the replica's own queue stays short and the
order that matters is decided here, where every tenant's request is seen. Requests below the top
priority class may fill a replica only up to `reserved_per_replica` fewer (`placing` tells the cap
whose request is being placed): a replica never preempts, so without that headroom an interactive
request would wait for a long batch request to finish. A request that finds
room and nobody waiting ahead of it goes at once. Waiting ones are granted in order whenever a
request ends (the dispatcher's `on_release`), and at least every `_WAKE_S` (a replica became
ready); past the deadline (`--queue-timeout`) the caller answers 503 as before. A client that
leaves while waiting is forgotten; one that leaves right after being granted gives its replica back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tandem.gateway.fair_queue import FairQueue, Ticket
from tandem.schedule.dispatch import Dispatcher, Target
from tandem.schedule.routers import RouteRequest

__all__ = ["FairAdmission"]

_WAKE_S = 0.25


class FairAdmission:
    def __init__(self, queue: FairQueue, dispatcher: Dispatcher, clock: Callable[[], float]) -> None:
        self.queue, self.dispatcher, self.clock = queue, dispatcher, clock
        self._scheduled = False
        self.placing: int | None = None  # the priority of the request being placed now (the cap reads it)

    def _pick(self, route: RouteRequest, priority: int) -> Target | None:
        self.placing = priority
        try:
            return self.dispatcher.pick(route)
        finally:
            self.placing = None

    def release_soon(self) -> None:
        """A request ended: grant waiting ones after the current step (a retry picks first)."""
        if self._scheduled or not len(self.queue):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._scheduled = True
        loop.call_soon(self._release)

    def _release(self) -> None:
        self._scheduled = False
        self.pump()

    def pump(self) -> None:
        """Grant waiting tickets, best first, while a replica has room for the best one."""
        while (ticket := self.queue.peek()) is not None:
            future: asyncio.Future = ticket.payload[0]
            if future.done():  # its waiter left
                self.queue.remove(ticket)
                continue
            target = self._pick(ticket.payload[1], ticket.priority)
            if target is None:
                return
            self.queue.pop()
            future.set_result(target)

    async def acquire(
        self, route: RouteRequest, tenant: str, priority: int, prompt_tokens: int, weight: float, timeout_s: float,
        draining: Callable[[], bool],
    ) -> Target | None:  # fmt: skip
        """A replica for this request, in its turn; None after `timeout_s` or once draining."""
        if not len(self.queue):
            target = self._pick(route, priority)
            if target is not None:
                self.queue.charge(tenant, prompt_tokens=prompt_tokens, weight=weight)
                return target
        future: asyncio.Future[Target] = asyncio.get_running_loop().create_future()
        ticket = Ticket(tenant, priority, prompt_tokens, weight, payload=(future, route))
        self.queue.push(ticket)
        deadline = self.clock() + timeout_s
        try:
            self.pump()
            while not future.done() and not draining() and (left := deadline - self.clock()) > 0:
                try:
                    await asyncio.wait_for(asyncio.shield(future), min(left, _WAKE_S))
                except TimeoutError:
                    self.pump()
            return future.result() if future.done() and not future.cancelled() else None
        except BaseException:  # the client left: a replica granted meanwhile goes back
            if future.done() and not future.cancelled():
                self.dispatcher.abandoned(future.result())
            raise
        finally:
            if not future.done():
                future.cancel()
            self.queue.remove(ticket)
