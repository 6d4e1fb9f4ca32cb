"""Admission: how many sequences the server has accepted, and whether it accepts more.

The engine queues without limit; the server must not, or a burst makes every client wait forever.
A request is admitted when its sequences fit in the KV slots plus a bounded wait queue; otherwise
it gets 429 with Retry-After. While shutting down (draining), nothing new is admitted (503).
Used from the event loop thread only, so plain integers suffice.
"""

from __future__ import annotations

from tandem.edge.errors import APIError

__all__ = ["Admission", "Lease"]


class Lease:
    """Sequences held by one request; release() is idempotent (a stream may end in two ways at once)."""

    def __init__(self, admission: Admission, count: int) -> None:
        self._admission = admission
        self.count = count
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission.in_flight -= self.count


class Admission:
    def __init__(self, capacity: int, retry_after_s: int = 1) -> None:
        self.capacity = capacity  # KV slots + the wait queue's length, in sequences
        self.retry_after_s = retry_after_s
        self.in_flight = 0
        self.draining = False

    def admit(self, count: int) -> Lease:
        if self.draining:
            raise APIError(503, "the server is shutting down and accepts no new requests", code="shutting_down")
        if self.in_flight + count > self.capacity:
            raise APIError(
                429,
                f"the server is at capacity ({self.in_flight} sequences running or queued, at most "
                f"{self.capacity}); retry after {self.retry_after_s} s",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self.in_flight += count
        return Lease(self, count)
