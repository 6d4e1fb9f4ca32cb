"""Routers: which replica serves a request, given the replicas' loads. Stateless apart from an injected RNG.

A router sees `ReplicaLoad`s (the gateway keeps `running` up to date with its own in-flight count,
so a burst does not pile onto one replica between load reports) and a `RouteRequest`; it returns
the chosen load, or None when no healthy replica is eligible.

- `LeastOutstanding`: fewest running + waiting requests (ties: least KV in use, then replica id).
- `PowerOfTwo`: two distinct replicas at random, the less loaded of them (Mitzenmacher 2001).
- `RegionAware`: the request's region first; spills to other regions only when all of its
  region's replicas are saturated (or it has none).
- `AdmissionCap`: wraps any router; a replica already holding the cap's requests (the SLO batch for
  the current length mix, `policies.prefill_budget.admission`) takes no more, nor one whose prompt tokens
  still to prefill, with this request's, exceed the token budget (`policies.prefill_budget`: what its
  decoding rows can carry within the TPOT target), nor (with a clock) one sent prompt tokens faster than
  the budget's pace for its running rows (`paced`, a leaky bucket per replica; a prompt costs what the
  replica's prefix cache does not hold, `uncached_tokens`), so the request waits at the gateway: a fleet
  sized too small shows as TTFT, not as every running user's TPOT.
- `PrefixAffinity`: rendezvous hash of the prompt's first block, so requests sharing a prefix land
  on the replica that has it cached, and adding or removing a replica moves only its share; when
  that replica is much busier than the least-loaded one, the least-loaded one instead.
- `KVAware`: what each replica reports it holds (its KV events, read into the gateway's index and
  handed here as the request's `PrefixMatch`), weighed against its load: the replica with the
  least `uncached prompt tokens + queued_request_tokens x outstanding requests`. Replicas that
  publish nothing are scored on load alone (least-outstanding among them).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tandem.contracts import ReplicaLoad

__all__ = [
    "AdmissionCap",
    "KVAware",
    "LeastOutstanding",
    "PowerOfTwo",
    "PrefixAffinity",
    "PrefixMatch",
    "ROUTER_NAMES",
    "RegionAware",
    "RouteRequest",
    "Router",
    "TokenAdmission",
    "eligible",
    "outstanding",
    "make_router",
    "paced",
    "uncached_tokens",
]


@dataclass(frozen=True)
class PrefixMatch:
    """How much of one request's prompt each replica holds, read from the replicas' KV events when the
    request arrived (a frozen snapshot: the router never sees the index change under it)."""

    prompt_tokens: int  # the request's prompt, tokenized as the replicas do
    cached_tokens: Mapping[str, int] = field(default_factory=dict)  # replica id -> leading prompt tokens it holds
    publishing: frozenset[str] = field(default_factory=frozenset)  # replicas whose KV events the gateway reads

    def cached(self, replica_id: str) -> int:
        return min(self.cached_tokens.get(replica_id, 0), self.prompt_tokens)


@dataclass(frozen=True)
class RouteRequest:
    region: str | None = None  # where the client is (None: anywhere)
    prefix: str = ""  # the prompt's beginning; PrefixAffinity hashes its first block
    exclude: frozenset[str] = field(default_factory=frozenset)  # replicas already tried for this request
    kv: PrefixMatch | None = None  # what each replica holds of the prompt (KVAware; None: not known)
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
    tokens: float

    def admits(self, pending_prefill_tokens: int, prompt_tokens: int) -> bool: ...

    def pace(self, rows: int) -> float | None: ...


class AdmissionCap:
    """`inner`'s choice among the replicas with fewer than `limit()` requests outstanding (None: no cap)
    and, with `budget`, whose `prefill_tokens` leave room for the request's prompt and, with a `clock` too,
    whose prompt tokens sent so far are within the budget's pace (`prefill_budget.paced`: a leaky bucket
    per replica, the only state here; None: no token cap)."""

    def __init__(
        self,
        inner: Router,
        limit: Callable[[], int | None],
        budget: Callable[[], TokenAdmission | None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.inner = inner
        self.limit = limit
        self.budget = budget
        self.clock = clock
        self.due: dict[str, float] = {}  # replica id -> when the prompt tokens sent to it are paid off at the pace

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        cap = self.limit()
        if cap is not None:
            replicas = [r for r in replicas if outstanding(r) < cap]
        tokens = self.budget() if self.budget is not None else None
        if tokens is None:
            return self.inner.choose(request, replicas)
        now = self.clock() if self.clock is not None else None
        kept = []
        for r in replicas:  # a hot loop (the simulator asks it per queued request and replica): the cheap tests first
            prompt = request.prompt_tokens if request.kv is None else uncached_tokens(request, r.replica_id)
            if r.prefill_tokens > 0 and not tokens.admits(r.prefill_tokens, prompt):
                continue
            due = self.due.get(r.replica_id) if now is not None else None
            if due is not None and due > now and paced(due, now, prompt, tokens.pace(r.running), tokens.tokens) is None:
                continue
            kept.append(r)
        choice = self.inner.choose(request, kept)
        if choice is not None and now is not None:
            prompt = request.prompt_tokens if request.kv is None else uncached_tokens(request, choice.replica_id)
            after = paced(self.due.get(choice.replica_id), now, prompt, tokens.pace(choice.running), tokens.tokens)
            if after is not None:
                self.due[choice.replica_id] = after
            if len(self.due) > 4 * len(replicas) + 64:  # forget replicas long paid off (gone ones among them)
                self.due = {rid: due for rid, due in self.due.items() if due > now}
        return choice


def uncached_tokens(request: RouteRequest, replica_id: str) -> int:
    """The prompt tokens `replica_id` would prefill for `request`: less what its prefix cache holds, where known."""
    if request.kv is None:
        return request.prompt_tokens
    return max(request.prompt_tokens - request.kv.cached(replica_id), 0)


def paced(due: float | None, now: float, prompt_tokens: int, pace: float | None, depth_tokens: float) -> float | None:
    """The generic cell rate (a leaky bucket) of one replica: `due` is when the prompt tokens it was sent are
    paid off at `pace` tokens/s (None: never sent). The new `due` if a prompt of `prompt_tokens` may go now,
    else None. A replica paid off (`due <= now`) takes any prompt, however long; one ahead by more than
    `depth_tokens` at the pace, none. No pace (None): always, `due` unchanged."""
    if prompt_tokens < 0 or depth_tokens < 0:
        raise ValueError("paced needs prompt_tokens >= 0 and depth_tokens >= 0")
    if pace is None:
        return due if due is not None else now
    ahead = max((due if due is not None else now) - now, 0.0)
    if ahead > 0 and (pace <= 0 or ahead * pace > depth_tokens * (1 + 1e-9)):
        return None
    return now + ahead + (prompt_tokens / pace if pace > 0 else math.inf)


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


class KVAware:
    """The replica where this request's first token comes soonest, by a cost in prompt tokens:

        cost(r) = (prompt tokens - leading tokens r holds)  +  queued_request_tokens x outstanding(r)

    The first term is the prefill r must still do (what its block cache saves is subtracted); the
    second prices every request already running or waiting on r as `queued_request_tokens` of
    prefill in front of this one (under continuous batching a request ahead costs a share of each
    iteration, not its whole run: about one mean prompt's prefill is a fair default; raise it to
    favour balance, lower it to favour cache hits). Lowest cost wins; ties: fewer outstanding, less
    KV in use, replica id. A replica with `saturation` requests outstanding or more (None: no cap)
    or `kv_saturation` of its KV in use is skipped while another is open, so a hot prefix does not
    pile onto one replica. Without a `PrefixMatch` (the prompt could not be tokenized, no replica
    publishes KV events) every cached term is 0: exactly least-outstanding.
    """

    def __init__(
        self, queued_request_tokens: int = 512, saturation: int | None = None, kv_saturation: float = 0.95
    ) -> None:
        if queued_request_tokens < 0 or (saturation is not None and saturation < 1) or not 0 < kv_saturation <= 1:
            raise ValueError("kv-aware needs queued_request_tokens >= 0, saturation >= 1 and kv_saturation in (0, 1]")
        self.queued_request_tokens = queued_request_tokens
        self.saturation = saturation
        self.kv_saturation = kv_saturation

    def saturated(self, load: ReplicaLoad) -> bool:
        return (
            self.saturation is not None and outstanding(load) >= self.saturation
        ) or load.kv_used >= self.kv_saturation

    def cost(self, request: RouteRequest, load: ReplicaLoad) -> int:
        queued = self.queued_request_tokens * outstanding(load)
        if request.kv is None:
            return queued
        return request.kv.prompt_tokens - request.kv.cached(load.replica_id) + queued

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        candidates = eligible(request, replicas)
        candidates = [r for r in candidates if not self.saturated(r)] or candidates
        return min(
            candidates,
            key=lambda r: (self.cost(request, r), outstanding(r), r.kv_used, r.replica_id),
            default=None,
        )


ROUTER_NAMES = ("least-outstanding", "power-of-two", "region-aware", "prefix-affinity", "kv-aware")


def make_router(name: str, rng: random.Random | None = None, **params) -> Router:
    """By name: least-outstanding, power-of-two, region-aware (around least-outstanding), prefix-affinity, kv-aware."""
    if name == "least-outstanding":
        return LeastOutstanding(**params)
    if name == "power-of-two":
        return PowerOfTwo(rng, **params)
    if name == "region-aware":
        return RegionAware(**params)
    if name == "prefix-affinity":
        return PrefixAffinity(**params)
    if name == "kv-aware":
        return KVAware(**params)
    raise ValueError(f"unknown router {name!r} (known: {', '.join(ROUTER_NAMES)})")
