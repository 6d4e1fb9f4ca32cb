"""The gateway under hostile or careless clients.

With real replicas behind an in-process gateway: lone surrogates, malformed and deeply nested JSON
are answered 400 by the gateway itself, replicas' own 4xx pass through, the keep-alive connection
carries the next request, and none of it counts against a replica: the breakers of both variants
stay closed, nothing falls back, nothing is retried.

A gateway process (`tandem serve --replicas-* ...`, no replica needed): a 1 GB body is refused
while the gateway's memory stays flat and a concurrent request is answered at once; 1 MB of
nesting is a 400; a flood of thousands of half-sent connections locks no client out and writes a
few log lines.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
from flood import HealthWatch, flood_and_measure
from server_process import ServerProcess

from .harness import MODEL_NAME, RunningGateway, metric, server_errors, total_retries, variant

pytestmark = pytest.mark.slow

GOOD = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2}
# body -> (status, who answers it)
BAD = [
    (b'{"model": "tiny", "prompt": "\\ud800", "max_tokens": 2}', 400),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "x\\udc00"}]}', 400),
    (b'{"model": "tiny", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
    (b'{"model": "tiny", "prompt": "unterminated', 400),
    (b'{"model": "tiny", "prompt": 5}', 400),  # valid JSON: the replica refuses it, the gateway passes it on
    (b'{"model": "no-such-model", "prompt": "a"}', 404),  # likewise
]


def test_bad_requests_are_4xx_keep_the_connection_and_never_count_against_a_replica(serve_model_dir, tmp_path):
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [variant("fast"), variant("baseline")],
        "fallback": "baseline",
        "policy": {"name": "hpa", "interval_s": 0.5},
        "breaker": {"consecutive_failures": 3, "failure_ratio": 0.1, "min_calls": 3, "window_s": 60, "open_s": 60},
    }
    gw = RunningGateway(raw, tmp_path / "logs")
    try:
        gw.wait_ready("fast")
        gw.wait_ready("baseline")
        ports = set()
        with httpx.Client(base_url=gw.url, timeout=60, headers={"Content-Type": "application/json"}) as client:
            for _ in range(6):
                for body, status in BAD:
                    r = client.post("/v1/completions", content=body)
                    assert r.status_code == status, r.text
                    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
                    ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
                ok = client.post("/v1/completions", json=GOOD)
                assert ok.status_code == 200, ok.text
                ports.add(ok.extensions["network_stream"].get_extra_info("client_addr")[1])
        assert len(ports) == 1
        text = gw.metrics()
        for name in ("fast", "baseline"):
            assert metric(text, "tandem:breaker_state", variant=name) == 0, name
            assert metric(text, "tandem:fallback_total", variant=name) == 0, name
        assert total_retries(text) == 0 and server_errors(text) == 0
        gw.settled()
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def gateway(serve_model_dir, tmp_path_factory):
    """A gateway process scaled to zero (a refused request never starts a replica)."""
    root = tmp_path_factory.mktemp("gateway-edge")
    args = [
        "--model", str(serve_model_dir), "--served-model-name", MODEL_NAME, "--recipe", "baseline",
        "--replicas-min", "0", "--replicas-max", "1", "--policy", "kpa", "--log-dir", str(root / "replicas"),
        "--max-connections", "400", "--header-timeout", "3", "--max-body-bytes", "1048576",
    ]  # fmt: skip
    process = ServerProcess(args, root / "gateway.log")
    try:
        wait_healthy(process)
        yield process
    finally:
        process.stop()


def wait_healthy(process: ServerProcess, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(process.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(process.log())


def memory_peak(pid: int) -> int:
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def response_of(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_a_1gb_body_is_refused_with_flat_memory_and_no_stall(gateway):
    peak_before = memory_peak(gateway.proc.pid)
    with HealthWatch(gateway.url) as watch:
        # Declared: refused before a byte of it is read.
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000000\r\n\r\n")  # fmt: skip
            answer = response_of(sock)
        assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer
        # Chunked, no length: counted as it arrives, refused once past 1 MiB; the rest is never read.
        sent = 0
        chunk = b"%x\r\n%s\r\n" % (1 << 16, b"x" * (1 << 16))
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            sock.settimeout(3)
            try:
                while sent < 1 << 30:
                    sock.sendall(chunk)
                    sent += 1 << 16
            except OSError:  # the gateway stopped reading (a full buffer times out) or closed the connection
                pass
            answer = response_of(sock)
        assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower()
        assert sent < 64 << 20, sent  # it stopped reading within tens of MB of a 1 GB body
        # 1 MB of nesting: a 400 from the edge (parsed off the event loop, never recursed into).
        deep = b"[" * 1_000_000
        r = httpx.post(gateway.url + "/v1/completions", content=deep, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep"
    assert watch.worst < 1.0, f"/health took {watch.worst:.2f} s meanwhile"
    assert memory_peak(gateway.proc.pid) - peak_before < 64 << 20


def test_a_connection_flood_locks_no_client_out_of_the_gateway(gateway):
    lines_before = len(gateway.log().splitlines())
    seen = flood_and_measure(gateway.url, gateway.port)
    assert max(seen["new_client_s"]) < 1.0, seen
    assert seen["left_open"] <= 50, seen
    log = gateway.log().splitlines()[lines_before:]
    assert len(log) < 40, "\n".join(log[:60])
    assert not any("Traceback" in line for line in log)


def test_a_header_block_over_the_limit_gets_431_whether_it_arrives_whole_or_in_pieces(gateway):
    """The gateway process's 16 KiB limit on the request line and headers: 600 headers of 58 KB sent in
    one write, the same trickled in 4 KB pieces (cut while still arriving), and one 60 KB x-request-id
    all get 431 with an OpenAI-style body; a normal request on a new connection is answered as before."""
    many = b"".join(b"x-h%03d: %s\r\n" % (i, b"v" * 88) for i in range(600))
    head = b"GET /v1/models HTTP/1.1\r\nHost: t\r\n"
    for block, piece in ((many, None), (many, 4096), (b"x-request-id: " + b"r" * 60_000 + b"\r\n", None)):
        data = head + block + b"\r\n"
        with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
            try:
                if piece is None:
                    sock.sendall(data)
                else:  # up to just past the limit, then nothing more: the answer is not lost to a reset
                    for at in range(0, 20 * 1024, piece):
                        sock.sendall(data[at : at + piece])
                        time.sleep(0.005)
            except OSError:  # the gateway answered and closed before the rest was sent
                pass
            answer = response_of(sock)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        assert b"request_header_fields_too_large" in answer and b"16384" in answer
    assert httpx.get(gateway.url + "/health", headers={"x-request-id": "r" * 200}, timeout=10).status_code == 200
