"""The gateway's observers (tandem.gateway.observers): silent by default, fanned out to several."""

from __future__ import annotations

from tandem.gateway.observers import NO_OBSERVER, NO_REQUEST_OBSERVER, Observers


class Recording:
    def __init__(self, name: str, interested: bool = True) -> None:
        self.name, self.interested, self.events = name, interested, []

    def request(self, path, payload, headers):
        return self if self.interested else NO_REQUEST_OBSERVER

    def attempt(self, url, stream, at):
        self.events.append(("attempt", url, stream, at))

    def headers(self):
        return {f"x-{self.name}": "1"}

    def response(self, status, headers, at):
        self.events.append(("response", status))

    def chunk(self, data, at):
        self.events.append(("chunk", data))

    def done(self, variant, at, error=None):
        self.events.append(("done", variant, error))

    def cancelled(self):
        self.events.append(("cancelled",))


def test_nothing_observes_by_default():
    seen = NO_OBSERVER.request("/v1/completions", {}, {})
    assert seen is NO_REQUEST_OBSERVER and seen.headers() == {}
    seen.attempt("http://r", True, 0.0)
    seen.done("v", 1.0)  # no effect, no error


def test_a_request_is_told_to_every_interested_observer_in_order():
    a, b, bored = Recording("a"), Recording("b"), Recording("c", interested=False)
    seen = Observers([a, bored, b]).request("/v1/completions", {"prompt": "x"}, {})
    seen.attempt("http://r", False, 0.5)
    assert dict(seen.headers()) == {"x-a": "1", "x-b": "1"}
    seen.response(200, {}, 0.6)
    seen.chunk(b"data", 0.7)
    seen.done("v", 0.8)
    expected = [("attempt", "http://r", False, 0.5), ("response", 200), ("chunk", b"data"), ("done", "v", None)]
    assert a.events == b.events == expected and bored.events == []


def test_one_interested_observer_gets_the_request_itself_and_none_gets_silence():
    a = Recording("a")
    assert Observers([a]).request("/p", {}, {}) is a
    assert Observers([Recording("c", interested=False)]).request("/p", {}, {}) is NO_REQUEST_OBSERVER
    assert Observers().request("/p", {}, {}) is NO_REQUEST_OBSERVER
