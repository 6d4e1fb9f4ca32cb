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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["NO_OBSERVER", "NO_REQUEST_OBSERVER", "Observer", "Observers", "RequestObserver"]


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
