"""A request's priority on a replica, in vLLM's sense (an integer; the Batcher admits waiting
requests lowest first, ties in arrival order): the body's `priority` field, unless the gateway
sent its tenant's priority in `x-tandem-priority` (tandem.contracts.PRIORITY_HEADER), which wins: a
client behind a gateway does not choose its own place in the queue."""

from __future__ import annotations

from collections.abc import Mapping

from tandem.contracts import PRIORITY_HEADER

__all__ = ["request_priority"]

_BOUND = 2**31


def request_priority(headers: Mapping[str, str], body_priority: int = 0) -> int:
    raw = headers.get(PRIORITY_HEADER)
    if raw is not None:
        try:
            return max(-_BOUND, min(_BOUND - 1, int(raw)))
        except ValueError:
            pass
    return body_priority
