"""run_server: uvicorn around the app, with a graceful SIGTERM and the startup banner.

On SIGTERM (or Ctrl-C) the server stops admitting (new requests get 503, the listening socket
closes), lets in-flight requests finish for up to `shutdown_timeout`, cancels what is left
(which aborts those engine requests), stops the engine and exits 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Generator
from functools import partial
from types import FrameType

import uvicorn

from tandem.serve.app import create_app
from tandem.serve.config import ServerConfig
from tandem.serve.served import ServedModel, load_served_model

__all__ = ["run_server", "startup_banner", "TandemServer", "ExitZeroServer", "client_host"]

logger = logging.getLogger("tandem.serve")


class ExitZeroServer(uvicorn.Server):
    """uvicorn that exits 0 after a clean shutdown on SIGTERM/SIGINT (uvicorn re-raises the signal
    after shutting down, so the process would die "killed by SIGTERM")."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


class TandemServer(ExitZeroServer):
    def __init__(self, config: uvicorn.Config, on_shutdown_signal: Callable[[], None], grace_s: float) -> None:
        super().__init__(config)
        self._on_shutdown_signal = on_shutdown_signal
        self._grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self._on_shutdown_signal()
            logger.info(
                "%s: admitting no new requests; in-flight ones get up to %g s to finish",
                signal.Signals(sig).name,
                self._grace_s,
            )
        super().handle_exit(sig, frame)


def client_host(host: str) -> str:
    """The address a client on this machine uses for a server bound to `host`."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def startup_banner(config: ServerConfig, served: ServedModel, port: int) -> str:
    base = f"http://{client_host(config.host)}:{port}"
    body = json.dumps({"model": served.name, "prompt": "def fibonacci(n):", "max_tokens": 64})
    auth = ' -H "Authorization: Bearer $TANDEM_API_KEY"' if config.api_key else ""
    return "\n".join(
        [
            f"tandem serve is ready at {base} (OpenAI API under {base}/v1)",
            f"  model:  {served.name} ({served.path}), context {served.max_model_len} tokens",
            f"  recipe: {served.recipe}",
            f"  slots:  {served.num_slots} running + {config.max_queue} queued sequences",
            "  try:",
            f"    curl {base}/v1/completions -H 'Content-Type: application/json'{auth} \\",
            f"      -d '{body}'",
        ]
    )


def run_server(config: ServerConfig, load: Callable[[], ServedModel] | None = None) -> int:
    """Serve until SIGTERM/SIGINT. Returns the exit code: 0 after a clean shutdown, 1 if loading failed."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("tandem").setLevel(config.log_level.upper())
    exit_code = 0
    server: TandemServer | None = None

    def bound_port() -> int:
        for listener in server.servers if server else []:
            for sock in listener.sockets:
                return sock.getsockname()[1]
        return config.port

    def on_ready(served: ServedModel) -> None:
        logger.info("%s", startup_banner(config, served, bound_port()))

    def on_fatal(message: str) -> None:
        nonlocal exit_code
        exit_code = 1
        if server is not None:
            server.should_exit = True

    app = create_app(
        config,
        load or partial(load_served_model, config, created=int(time.time())),
        on_ready=on_ready,
        on_fatal=on_fatal,
    )
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=config.access_log,
        timeout_graceful_shutdown=config.shutdown_timeout,
        server_header=False,
    )
    server = TandemServer(uv_config, app.state.tandem.drain, config.shutdown_timeout)
    logger.info(
        "tandem serve: loading the model (%s) on %s:%d", config.model or "bundled default", config.host, config.port
    )
    server.run()
    return exit_code
