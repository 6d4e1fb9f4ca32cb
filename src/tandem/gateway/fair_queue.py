"""The gateway's wait queue when the fleet is saturated: priority first, then the Virtual Token
Counter (VTC) of "Fairness in Serving Large Language Models" (Sheng et al., OSDI 2024).

Each tenant has a counter of the service it received, in weighted tokens divided by its weight
(`prompt_weight` per prompt token, charged when a request is dispatched; `output_weight` per output
token, charged as they stream). The next request dispatched is, among the waiting requests of the
highest priority class, the oldest one of the tenant with the smallest counter. A tenant that starts
waiting after none of its requests waited has its counter lifted to the smallest counter of the
tenants waiting (or, when none waits, to the largest): so service a tenant did not ask for is never
banked as credit against the others, and a flooder cannot starve a tenant that arrives later.

The bound (the paper's fairness theorem for VTC): over any interval in which two tenants of one
priority class both have requests waiting, the service they received (in these weighted tokens)
differs by at most 2U, U the most service credited to one tenant at once (w_p * L_in for the
longest prompt, or w_q * M for one step's output, M the most tokens a batch holds; U <= w_p * L_in
+ w_q * M); here the gateway dispatches up to `max_inflight_per_replica` requests per replica,
which bounds M.

Strict priority between classes: a lower class is served only when no request of a higher one
waits (it may starve under a flood of the higher class; that is what priority means). Pure: no
clock, no I/O; the gateway's admission (tandem.gateway.admission) owns the waiting.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FairQueue", "Ticket"]


@dataclass(eq=False)
class Ticket:
    tenant: str
    priority: int
    prompt_tokens: int
    weight: float = 1.0
    payload: Any = None  # what the caller needs back (its future, its route)
    seq: int = field(default=0)


class FairQueue:
    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0) -> None:
        self.prompt_weight, self.output_weight = prompt_weight, output_weight
        self.counters: dict[str, float] = {}
        self.waiting: dict[str, deque[Ticket]] = {}  # tenant -> its waiting tickets, oldest first
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def queued(self, tenant: str) -> int:
        return len(self.waiting.get(tenant, ()))

    def push(self, ticket: Ticket) -> None:
        ticket.seq = next(self._seq)
        if not self.waiting.get(ticket.tenant):
            others = [self.counters.get(t, 0.0) for t, q in self.waiting.items() if q and t != ticket.tenant]
            floor = min(others) if others else max(self.counters.values(), default=0.0)
            self.counters[ticket.tenant] = max(self.counters.get(ticket.tenant, 0.0), floor)
        self.waiting.setdefault(ticket.tenant, deque()).append(ticket)

    def peek(self) -> Ticket | None:
        """The ticket to dispatch next: highest priority, then least counter, then oldest."""
        heads = [q[0] for q in self.waiting.values() if q]
        if not heads:
            return None
        return min(heads, key=lambda t: (-t.priority, self.counters.get(t.tenant, 0.0), t.seq))

    def pop(self) -> Ticket | None:
        ticket = self.peek()
        if ticket is not None:
            self._take(ticket)
            self.charge(ticket.tenant, prompt_tokens=ticket.prompt_tokens, weight=ticket.weight)
        return ticket

    def remove(self, ticket: Ticket) -> bool:
        """A waiting ticket leaves without service (its client left, its deadline passed)."""
        queue = self.waiting.get(ticket.tenant)
        if not queue or ticket not in queue:
            return False
        queue.remove(ticket)
        if not queue:
            del self.waiting[ticket.tenant]
        return True

    def _take(self, ticket: Ticket) -> None:
        queue = self.waiting[ticket.tenant]
        queue.remove(ticket)
        if not queue:
            del self.waiting[ticket.tenant]

    def charge(self, tenant: str, prompt_tokens: int = 0, output_tokens: int = 0, weight: float = 1.0) -> None:
        """Service `tenant` received, in weighted tokens (divided by its weight)."""
        cost = self.prompt_weight * prompt_tokens + self.output_weight * output_tokens
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / max(weight, 1e-9)
