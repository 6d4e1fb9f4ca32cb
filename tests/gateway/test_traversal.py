"""The replica's door is not reachable through the gateway (a real gateway and a real replica, raw HTTP).

A client holding a user key sends every traversal form (`../`, `%2e%2e/`, `..%2f`, `//`, `.%2e`,
`%252e`, `\\`, absolute-form targets) from every route of the gateway towards every route only a
replica serves (/metrics, /load, /openapi.json, /gate/tracks/<key>, /health): each gets the
gateway's own 404 (never a replica's body), and not one of them is forwarded: the only requests the
replica sees are the gateway's own probes and the one legitimate request sent as a control. The
request line and headers are bounded too: 600 headers of 58 KB, or one 60 KB `x-request-id`, get 431.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from .harness import RunningGateway, variant

pytestmark = pytest.mark.slow

KEY = "user-key"
GATEWAY_ROUTES = [
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/tiny", "/tokenize", "/detokenize",
    "/version", "/metrics", "/health", "/ready", "/admin/replicas", "/admin/use", "/admin/rollout", "/openapi.json",
]  # fmt: skip
REPLICA_ONLY = ["metrics", "load", "openapi.json", "gate/tracks/0123456789abcdef", "health"]


def traversals(route: str, target: str) -> list[str]:
    """`target` reached from `route` in every spelling a client could try (as sent, never normalized)."""
    depth = route.count("/")
    up = {
        "raw": "../" * depth,
        "encoded": "%2e%2e/" * depth,
        "upper": "%2E%2E/" * depth,
        "mixed": ".%2e/" * depth,
        "slash": "..%2f" * depth,
        "double": "%252e%252e/" * depth,
        "backslash": "..\\" * depth,
        "dot": "./" + "../" * depth,
    }
    forms = [f"{route}/{prefix}{target}" for prefix in up.values()]
    forms += [f"{route}/..%2F..%2F..%2F{target}", f"/{target}".replace("/", "//", 1), f"{route}//../{target}"]
    return forms


class Recording(httpx.AsyncBaseTransport):
    """What the gateway sends to replicas: (method, path) of every request."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.sent.append((request.method, request.url.raw_path.decode("latin-1")))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def raw_request(
    port: int, method: str, target: str, headers: bytes = b"", body: bytes = b"", key: str | None = KEY
) -> tuple[int, bytes]:
    """One request with `target` exactly as given (like curl --path-as-is); (status, body)."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode("latin-1")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + headers + b"\r\n" + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.fixture(scope="module")
def gateway(serve_model_dir, tmp_path_factory):
    transport = Recording()
    raw = {"model": str(serve_model_dir), "threads": 1, "variants": [variant("fast")], "policy": {"name": "hpa"}}
    gw = RunningGateway(raw, tmp_path_factory.mktemp("traversal") / "logs", transport=transport, api_key=KEY)
    gw.gw.replica_metrics = None  # the gateway's own scrape of GET /metrics would look like a forwarded one
    try:
        gw.wait_ready("fast")
        time.sleep(0.5)  # a scrape begun before it was turned off has landed
        with transport.lock:
            transport.sent.clear()
        yield gw, transport
    finally:
        gw.stop()


def test_no_traversal_form_reaches_a_replica_from_any_route(gateway):
    gw, transport = gateway
    status, body = raw_request(gw.port, "GET", "/v1/models")  # the control: a legitimate request is forwarded
    assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny"
    replica = next(iter(gw.backend.list())).url
    tried = 0
    for route in GATEWAY_ROUTES:
        for target in REPLICA_ONLY:
            for form in [*traversals(route, target), f"{replica}/{target}", f"http://127.0.0.1:{gw.port}/{target}"]:
                for method in ("GET", "POST"):
                    status, body = raw_request(gw.port, method, form, body=b"{}" if method == "POST" else b"")
                    tried += 1
                    assert status in (401, 404), (method, form, status, body[:300])
                    error = json.loads(body)["error"]
                    assert error["code"] in ("not_found", "invalid_api_key"), (method, form, body[:300])
                    assert b"replica_id" not in body and b"# HELP" not in body, (method, form)
    # Without a key, an open route's prefix does not open a protected one: the path is judged first.
    for form in ("/health/../v1/models", "/health/%2e%2e/admin/replicas", "/ready/..%2fv1%2fmodels", "//v1/models"):
        status, body = raw_request(gw.port, "GET", form, key=None)
        assert status == 404 and b"not canonical" in body, (form, status, body[:300])
    assert raw_request(gw.port, "GET", "/v1/models", key=None)[0] == 401
    forwarded = {sent for sent in transport.sent if sent[1] not in ("/load", "/health")}
    assert forwarded == {("GET", "/v1/models")}, forwarded
    print(f"{tried} traversal requests: every one 401/404 at the gateway, none forwarded")


def test_a_header_block_over_16_kb_gets_431_and_is_not_forwarded(gateway):
    gw, transport = gateway
    before = len(transport.sent)
    many = b"".join(b"x-h%03d: %s\r\n" % (i, b"v" * 88) for i in range(600))
    assert 57_000 < len(many) < 60_000
    for headers in (many, b"x-request-id: " + b"r" * 60_000 + b"\r\n"):
        status, body = raw_request(gw.port, "POST", "/v1/completions", headers, b'{"model":"tiny","prompt":"a"}')
        assert status == 431, body[:300]
        error = json.loads(body)["error"]
        assert error["code"] == "request_header_fields_too_large" and "16384" in error["message"]
    assert not [s for s in transport.sent[before:] if s[1] not in ("/load", "/health")]
    status, _ = raw_request(gw.port, "GET", "/v1/models", b"x-request-id: " + b"r" * 200 + b"\r\n")
    assert status == 200
