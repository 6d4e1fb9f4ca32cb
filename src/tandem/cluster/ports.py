"""Ports for local replicas: any free one the OS gives, or the next free one of a range (a firewall's opening)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection

from tandem.cluster.backend import BackendError

__all__ = ["PortRange", "find_free_port"]


def find_free_port(taken: Collection[int] = (), host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (another process could take it before the replica binds: rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortRange:
    """Ports from `low`..`high` (a firewall's opening): the next one this backend does not hold and the
    OS lets us bind, going round the range so a port just given up is the last to be reused."""

    def __init__(
        self, low: int, high: int, bindable: Callable[[int], bool] | None = None, *, host: str = "127.0.0.1",
        start: int | None = None,
    ) -> None:  # fmt: skip
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"a port range needs 1 <= low <= high <= 65535 (got {low}-{high})")
        self.low, self.high = low, high
        self.bindable = bindable or (lambda port: _bindable(port, host))
        self._next = low if start is None else low + (start - low) % (high - low + 1)

    def __call__(self, taken: Collection[int]) -> int:
        size = self.high - self.low + 1
        for i in range(size):
            port = self.low + (self._next - self.low + i) % size
            if port not in taken and self.bindable(port):
                self._next = self.low + (port - self.low + 1) % size
                return port
        raise BackendError(f"no free port in {self.low}-{self.high} ({len(taken)} held by replicas)")
