"""Routers: which replica serves a request, given the replicas' loads. Stateless apart from an injected RNG.

A router sees `ReplicaLoad`s (the gateway keeps `running` up to date with its own in-flight count,
so a burst does not pile onto one replica between load reports) and a `RouteRequest`; it returns
the chosen load, or None when no healthy replica is eligible.

- `LeastOutstanding`: fewest running + waiting requests (ties: least KV in use, then replica id).
- `PowerOfTwo`: two distinct replicas at random, the less loaded of them (Mitzenmacher 2001).
- `RegionAware`: the request's region first; spills to other regions only when all of its
  region's replicas are saturated (or it has none).
- `AdmissionCap`: wraps any router; a replica already holding the cap's requests (the SLO batch for
  the current length mix, `policies.slo.admission_limit`) takes no more, nor one whose prompt tokens
  still to prefill, with this request's, exceed the token budget (`policies.prefill_budget`: what its
  decoding rows can carry within the TPOT target), so the request waits at the gateway: a fleet sized
  too small shows as TTFT, not as every running user's TPOT.
- `PrefixAffinity`: rendezvous hash of the prompt's first block, so requests sharing a prefix land
  on the replica that has it cached, and adding or removing a replica moves only its share; when
  that replica is much busier than the least-loaded one, the least-loaded one instead.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tandem.contracts import ReplicaLoad

__all__ = [
    "AdmissionCap",
    "LeastOutstanding",
    "PowerOfTwo",
    "PrefixAffinity",
    "RegionAware",
    "RouteRequest",
    "Router",
    "TokenAdmission",
    "eligible",
    "outstanding",
    "make_router",
]


@dataclass(frozen=True)
class RouteRequest:
    region: str | None = None  # where the client is (None: anywhere)
    prefix: str = ""  # the prompt's beginning; PrefixAffinity hashes its first block
    exclude: frozenset[str] = field(default_factory=frozenset)  # replicas already tried for this request
    prompt_tokens: int = 0  # the prompt's length, where known (AdmissionCap's token budget; 0: unknown)


class Router(Protocol):
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None: ...


def outstanding(load: ReplicaLoad) -> int:
    return load.running + load.waiting


def eligible(request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> list[ReplicaLoad]:
    return [r for r in replicas if r.healthy and r.replica_id not in request.exclude]


def _least(candidates: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
    return min(candidates, key=lambda r: (outstanding(r), r.kv_used, r.replica_id), default=None)


class LeastOutstanding:
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        return _least(eligible(request, replicas))


class TokenAdmission(Protocol):
    def admits(self, pending_prefill_tokens: int, prompt_tokens: int) -> bool: ...


class AdmissionCap:
    """`inner`'s choice among the replicas with fewer than `limit()` requests outstanding (None: no cap)
    and, with `budget`, whose `prefill_tokens` leave room for the request's prompt (None: no token cap)."""

    def __init__(
        self,
        inner: Router,
        limit: Callable[[], int | None],
        budget: Callable[[], TokenAdmission | None] | None = None,
    ) -> None:
        self.inner = inner
        self.limit = limit
        self.budget = budget

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        cap = self.limit()
        if cap is not None:
            replicas = [r for r in replicas if outstanding(r) < cap]
        tokens = self.budget() if self.budget is not None else None
        if tokens is not None:
            replicas = [r for r in replicas if tokens.admits(r.prefill_tokens, request.prompt_tokens)]
        return self.inner.choose(request, replicas)


class PowerOfTwo:
    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        candidates = eligible(request, replicas)
        if len(candidates) <= 2:
            return _least(candidates)
        return _least(self.rng.sample(candidates, 2))


class RegionAware:
    """Prefer the request's region; spill over when every replica there has `saturation` outstanding
    requests or more (or `kv_saturation` of its KV cache in use)."""

    def __init__(self, inner: Router | None = None, saturation: int = 8, kv_saturation: float = 0.95) -> None:
        self.inner = inner or LeastOutstanding()
        self.saturation = saturation
        self.kv_saturation = kv_saturation

    def saturated(self, load: ReplicaLoad) -> bool:
        return outstanding(load) >= self.saturation or load.kv_used >= self.kv_saturation

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        candidates = eligible(request, replicas)
        if request.region is not None:
            local = [r for r in candidates if r.region == request.region]
            open_local = [r for r in local if not self.saturated(r)]
            if open_local:
                return self.inner.choose(request, open_local)
            remote = [r for r in candidates if r.region != request.region and not self.saturated(r)]
            if remote:
                return self.inner.choose(request, remote)  # spill over
            if local:
                return self.inner.choose(request, local)  # everyone is saturated: queue at home
        return self.inner.choose(request, candidates)


def _score(key: bytes, replica_id: str) -> int:
    digest = hashlib.blake2b(key + b"\x00" + replica_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class PrefixAffinity:
    """Rendezvous (highest-random-weight) hashing of the first `block_chars` characters of the prompt.

    Imbalanced (SGLang's cache-aware router uses the same two tests): the affine replica has more
    than `balance_abs` outstanding requests over the least-loaded one *and* more than `balance_rel`
    times its load; then the least-loaded replica serves instead.
    """

    def __init__(self, block_chars: int = 256, balance_abs: int = 4, balance_rel: float = 1.5) -> None:
        self.block_chars = block_chars
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel

    def affine(self, request: RouteRequest, candidates: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        key = request.prefix[: self.block_chars].encode()
        return max(candidates, key=lambda r: _score(key, r.replica_id), default=None)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        candidates = eligible(request, replicas)
        if not request.prefix:
            return _least(candidates)
        chosen, least = self.affine(request, candidates), _least(candidates)
        if chosen is None or least is None:
            return None
        gap = outstanding(chosen) - outstanding(least)
        if gap > self.balance_abs and outstanding(chosen) > self.balance_rel * outstanding(least):
            return least
        return chosen


def make_router(name: str, rng: random.Random | None = None, **params) -> Router:
    """By name: least-outstanding, power-of-two, region-aware (around least-outstanding), prefix-affinity."""
    if name == "least-outstanding":
        return LeastOutstanding(**params)
    if name == "power-of-two":
        return PowerOfTwo(rng, **params)
    if name == "region-aware":
        return RegionAware(**params)
    if name == "prefix-affinity":
        return PrefixAffinity(**params)
    raise ValueError(f"unknown router {name!r} (known: least-outstanding, power-of-two, region-aware, prefix-affinity)")
