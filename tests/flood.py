"""A connection flood from this process, and watching a server stay responsive through it.

`Flood(host, port, count)` opens thousands of TCP connections (non-blocking, as fast as the kernel
takes them), sends each the start of a request line and headers but never the blank line that ends
them, and holds them until `close()`; `SteadyFlood` keeps adding more. `flood_and_measure` does
both and times new clients meanwhile. `HealthWatch` polls GET /health and keeps the slowest answer.
"""

from __future__ import annotations

import resource
import select
import socket
import threading
import time

import httpx

__all__ = ["Flood", "HealthWatch", "SteadyFlood", "flood_and_measure", "fresh_request_seconds", "still_open"]

PARTIAL = b"POST /v1/completions HTTP/1.1\r\nHost: flood\r\nContent-Type: application/json\r\nX-Slow: "


class Flood:
    def __init__(self, host: str, port: int, count: int) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < count + 512:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
        self.sockets: list[socket.socket] = []
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex((host, port))
            self.sockets.append(sock)
        deadline = time.monotonic() + 30
        pending = {sock.fileno(): sock for sock in self.sockets}
        poller = select.poll()  # select() stops at descriptor 1023
        for fd in pending:
            poller.register(fd, select.POLLOUT)
        while pending and time.monotonic() < deadline:  # send the partial request once each is connected
            for fd, _ in poller.poll(500):
                poller.unregister(fd)
                try:
                    pending.pop(fd).send(PARTIAL)
                except OSError:
                    pass  # the server already closed it (shed): fine, it is part of the flood

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


class SteadyFlood(threading.Thread):
    """More half-sent connections, `per_second` of them, until stopped (held, then closed on stop)."""

    def __init__(self, host: str, port: int, per_second: int) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.per_second = host, port, per_second
        self.stopped = threading.Event()
        self.opened = 0
        self.floods: list[Flood] = []

    def run(self) -> None:
        while not self.stopped.is_set():
            started = time.monotonic()
            self.floods.append(Flood(self.host, self.port, self.per_second // 10))
            self.opened += self.per_second // 10
            self.stopped.wait(max(0.0, 0.1 - (time.monotonic() - started)))

    def stop(self) -> None:
        self.stopped.set()
        self.join(30)
        for flood in self.floods:
            flood.close()


def still_open(sockets: list[socket.socket]) -> int:
    """How many of `sockets` the server has not closed (a closed one polls readable and reads EOF or an error)."""
    poller = select.poll()
    for sock in sockets:
        poller.register(sock.fileno(), select.POLLIN)
    closed = 0
    by_fd = {sock.fileno(): sock for sock in sockets}
    for fd, events in poller.poll(0):
        if events & (select.POLLHUP | select.POLLERR):
            closed += 1
            continue
        try:
            if not by_fd[fd].recv(1, socket.MSG_PEEK):
                closed += 1
        except OSError:
            closed += 1
    return len(sockets) - closed


def fresh_request_seconds(url: str, path: str = "/health") -> float:
    """Seconds a brand-new client (its own connection) takes to get `path` answered 200."""
    started = time.monotonic()
    with httpx.Client(timeout=10) as client:
        assert client.get(url + path).status_code == 200
    return time.monotonic() - started


def flood_and_measure(url: str, port: int, burst: int = 3000, per_second: int = 500, samples: int = 5) -> dict:
    """Hold `burst` half-sent connections, keep opening `per_second` more, and time `samples` new clients.

    Returns the seconds the burst took to be absorbed (the kernel queues it meanwhile), each new
    client's seconds, and how many of the burst's connections the server still held once past its
    header deadline (waiting up to 30 s for it to close them).
    """
    started = time.monotonic()
    held = Flood("127.0.0.1", port, burst)
    steady = SteadyFlood("127.0.0.1", port, per_second)
    try:
        fresh_request_seconds(url)
        absorbed = time.monotonic() - started
        steady.start()
        seconds = [fresh_request_seconds(url) for _ in range(samples)]
        deadline = time.monotonic() + 30
        while still_open(held.sockets) > 50 and time.monotonic() < deadline:
            time.sleep(0.5)
        left_open = still_open(held.sockets)
    finally:
        steady.stop()
        held.close()
    return {
        "connections": burst + steady.opened, "burst_absorbed_s": absorbed, "new_client_s": seconds,
        "left_open": left_open,
    }  # fmt: skip


class HealthWatch(threading.Thread):
    """GET /health every 20 ms on its own connection; `stop()` returns the slowest answer's seconds."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.worst, self.count = url, 0.0, 0
        self.stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self.stopped.is_set():
                started = time.monotonic()
                assert client.get("/health").status_code == 200
                self.worst = max(self.worst, time.monotonic() - started)
                self.count += 1
                self.stopped.wait(0.02)

    def __enter__(self) -> HealthWatch:
        self.start()
        while self.count < 3 and self.is_alive():  # watching before the test's load comes
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> float:
        self.stopped.set()
        self.join(30)
        return self.worst
