"""A model's cold starts, as its users feel them: from the first request that found no replica
ready (it waits at the gateway, counted as buffered, which the model's policy reads and starts a
replica for) to the moment a waiting request got one.

Pure bookkeeping on times passed in (the gateway's clock); the proxy tells it when a request
starts waiting on a cold model, when one is served after waiting, and when the last one gave up.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ColdStarts"]


@dataclass
class ColdStarts:
    waiting_since: float | None = None  # a cold start under way: when its first request arrived
    last_s: float | None = None  # the last cold start's seconds
    count: int = 0  # cold starts completed

    def waiting(self, now: float, *, cold: bool) -> None:
        """A request waits for a replica; `cold`: the model has none ready (nor was one under way)."""
        if cold and self.waiting_since is None:
            self.waiting_since = now

    def served(self, now: float) -> None:
        """A waiting request got a replica: a cold start under way is over."""
        if self.waiting_since is not None:
            self.last_s = now - self.waiting_since
            self.count += 1
            self.waiting_since = None

    def abandoned(self, *, still_waiting: int) -> None:
        """A waiting request left or timed out; with none left waiting, no cold start is under way."""
        if still_waiting <= 0:
            self.waiting_since = None
