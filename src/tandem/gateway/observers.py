"""What the proxy tells the rest of the gateway about a request, as events; nothing is threaded by hand.

The proxy knows nothing of shadow traffic (or, later, usage accounting): at arrival it asks the
gateway's `Observer` for a `RequestObserver` and reports to it what happens to the request:

- `attempt(url, stream, at)`: an attempt is sent to the replica at `url` (a retry starts a new one);
  `headers()` is what that attempt carries besides the client's headers;
- `response(status, headers, at)`: the replica's status and headers (for a stream: before the body);
- `chunk(data, at)`: bytes relayed to the client (a whole non-streamed body is one chunk);
- `done(variant, at, error=None)`: the client has the whole answer, served by `variant`; `variant`
  None when the gateway answered itself (no replica, a failed retry); `error` when a stream broke;
- `cancelled()`: the client left before it had the whole answer.

Exactly one of `done` / `cancelled` ends each request; the events after it are ignored. By default
an observer does nothing (`NO_OBSERVER`); `Observers` fans one request out to several.

`DemandObserver` feeds the capacity policy what only the gateway sees: each request as it arrives
(`DemandMeter.arrive`, with its prompt tokens estimated at characters / 4: the gateway has no tokenizer)
and whether its answer met the SLO (`DemandMeter.outcome`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "also_observe",
    "NO_OBSERVER",
    "NO_REQUEST_OBSERVER",
    "DemandObserver",
    "Observer",
    "Observers",
    "RequestObserver",
    "estimate_prompt_tokens",
    "prompt_text",
]


class RequestObserver(Protocol):
    def attempt(self, url: str, stream: bool, at: float) -> None: ...
    def headers(self) -> Mapping[str, str]: ...
    def response(self, status: int, headers: Mapping[str, str], at: float) -> None: ...
    def chunk(self, data: bytes, at: float) -> None: ...
    def done(self, variant: str | None, at: float, error: str | None = None) -> None: ...
    def cancelled(self) -> None: ...


class Observer(Protocol):
    def request(self, path: str, payload: Any, headers: Mapping[str, str]) -> RequestObserver:
        """A request arrived (`payload`: its parsed JSON body); must return at once."""
        ...


class _Silent:
    """Observes nothing: what every request gets when no observer is interested in it."""

    def attempt(self, url: str, stream: bool, at: float) -> None:
        pass

    def headers(self) -> Mapping[str, str]:
        return {}

    def response(self, status: int, headers: Mapping[str, str], at: float) -> None:
        pass

    def chunk(self, data: bytes, at: float) -> None:
        pass

    def done(self, variant: str | None, at: float, error: str | None = None) -> None:
        pass

    def cancelled(self) -> None:
        pass

    def request(self, path: str, payload: Any, headers: Mapping[str, str]) -> RequestObserver:
        return self


_SILENT = _Silent()
NO_REQUEST_OBSERVER: RequestObserver = _SILENT
NO_OBSERVER: Observer = _SILENT


class _Each:
    """One request's events, told to each of several request observers in turn."""

    def __init__(self, each: Sequence[RequestObserver]) -> None:
        self.each = each

    def attempt(self, url: str, stream: bool, at: float) -> None:
        for o in self.each:
            o.attempt(url, stream, at)

    def headers(self) -> Mapping[str, str]:
        out: dict[str, str] = {}
        for o in self.each:
            out.update(o.headers())
        return out

    def response(self, status: int, headers: Mapping[str, str], at: float) -> None:
        for o in self.each:
            o.response(status, headers, at)

    def chunk(self, data: bytes, at: float) -> None:
        for o in self.each:
            o.chunk(data, at)

    def done(self, variant: str | None, at: float, error: str | None = None) -> None:
        for o in self.each:
            o.done(variant, at, error)

    def cancelled(self) -> None:
        for o in self.each:
            o.cancelled()


class Observers:
    """Several observers as one; a request none of them is interested in gets NO_REQUEST_OBSERVER."""

    def __init__(self, observers: Sequence[Observer] = ()) -> None:
        self.observers = list(observers)

    def add(self, observer: Observer) -> None:
        self.observers.append(observer)

    def request(self, path: str, payload: Any, headers: Mapping[str, str]) -> RequestObserver:
        each = [o.request(path, payload, headers) for o in self.observers]
        each = [o for o in each if o is not NO_REQUEST_OBSERVER]
        if not each:
            return NO_REQUEST_OBSERVER
        return each[0] if len(each) == 1 else _Each(each)


def also_observe(current: Observer, observer: Observer) -> Observer:
    """`current` with `observer` added: the one way a gateway piece joins the observers already wired."""
    if isinstance(current, Observers):
        current.add(observer)
        return current
    return Observers([observer] if current is NO_OBSERVER else [current, observer])


def prompt_text(payload: Any) -> str:
    """The request's prompt as text (for prefix-affinity routing and a rough demand estimate)."""
    if not isinstance(payload, dict):
        return ""
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    messages = payload.get("messages")
    if isinstance(messages, list):
        return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    return ""


def estimate_prompt_tokens(payload: Any) -> int:
    """A prompt's tokens without a tokenizer: characters / 4 (English text with a BPE vocabulary; enough for
    a budget of prompt tokens, not for billing)."""
    return len(prompt_text(payload)) // 4


class DemandMeterLike(Protocol):
    def arrive(self, variant: str, now: float, prompt_tokens: int) -> None: ...
    def outcome(self, variant: str, now: float, within_slo: bool) -> None: ...


class DemandObserver:
    """Counts each request at arrival for the variant the policy sizes (`variant()`: the model's primary;
    during a rollout its arrivals are counted there) and, when `slo` (TTFT s, TPOT s) is given, judges each
    answer: a stream by its first chunk (TTFT) and its SSE events after it (TPOT); a whole body by its
    latency against TTFT + TPOT x (completion tokens - 1). An answer the gateway gave itself (no replica,
    a failed retry) or a broken stream missed it; a client that left is not judged."""

    def __init__(
        self,
        meter: DemandMeterLike,
        variant: Callable[[], str],
        clock: Callable[[], float],
        slo: tuple[float, float] | None = None,
    ) -> None:
        if slo is not None and (slo[0] <= 0 or slo[1] <= 0):
            raise ValueError(f"the SLO needs TTFT and TPOT > 0 (got {slo})")
        self.meter, self.variant, self.clock, self.slo = meter, variant, clock, slo

    def request(self, path: str, payload: Any, headers: Mapping[str, str]) -> RequestObserver:
        now, variant = self.clock(), self.variant()
        self.meter.arrive(variant, now, estimate_prompt_tokens(payload))
        if self.slo is None:
            return NO_REQUEST_OBSERVER
        return _Judged(self, variant, now)


class _Judged:
    """One request's answer against the SLO (DemandObserver)."""

    def __init__(self, owner: DemandObserver, variant: str, arrived: float) -> None:
        self.owner, self.variant, self.arrived = owner, variant, arrived
        self.stream = False
        self.first: float | None = None
        self.events = 0
        self.body = bytearray()
        self.over = False

    def attempt(self, url: str, stream: bool, at: float) -> None:
        self.stream = stream

    def headers(self) -> Mapping[str, str]:
        return {}

    def response(self, status: int, headers: Mapping[str, str], at: float) -> None:
        pass

    def chunk(self, data: bytes, at: float) -> None:
        if self.first is None:
            self.first = at
        if self.stream:
            self.events += data.count(b"data:") - data.count(b"[DONE]")
        elif len(self.body) < 1 << 20:  # a whole answer: its usage says how many tokens
            self.body += data

    def done(self, variant: str | None, at: float, error: str | None = None) -> None:
        if self.over:
            return
        self.over = True
        ttft, tpot = self.owner.slo or (0.0, 0.0)
        within = variant is not None and error is None and self.first is not None
        if within and self.stream:
            tokens = max(self.events - 1, 0)  # the first event carries the first token
            within = self.first - self.arrived <= ttft and (at - self.first) <= tpot * max(tokens, 1)
        elif within:
            within = at - self.arrived <= ttft + tpot * max(_completion_tokens(bytes(self.body)) - 1, 0)
        self.owner.meter.outcome(variant or self.variant, at, within)

    def cancelled(self) -> None:
        self.over = True


def _completion_tokens(content: bytes) -> int:
    try:
        return int((json.loads(content).get("usage") or {}).get("completion_tokens", 0))
    except (ValueError, AttributeError, TypeError):
        return 0
