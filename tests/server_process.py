"""A real `tandem serve` process on a free loopback port, for tests and the load benchmark."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

__all__ = ["ServerProcess", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(extra: dict[str, str] | None) -> dict[str, str]:
    # The tester's own TANDEM_* settings (an API key, a config file) must not leak into the servers.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("TANDEM_") or k in ("TANDEM_CACHE", "TANDEM_KERNELS")
    }
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    return {**env, **(extra or {})}


class ServerProcess:
    """`python -m tandem.cli serve ARGS --port P`, its output in `log_path`."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=_environment(env),
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> ServerProcess:
        """Poll GET /ready until 200; fail with the server's log if it exits or never gets ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server was not ready within {timeout} s:\n{self.log()}")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> int | None:
        self.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        return self.proc.returncode
