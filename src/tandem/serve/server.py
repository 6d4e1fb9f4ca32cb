"""run_server: uvicorn around the app, with a graceful SIGTERM and the startup banner.

On SIGTERM (or Ctrl-C) the server stops admitting (new requests get 503, the listening socket
closes), lets in-flight requests finish for up to `shutdown_timeout`, cancels what is left
(which aborts those engine requests), stops the engine and exits 0.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from types import FrameType
from typing import Any

import uvicorn

from tandem.edge.lifeline import watch_parent
from tandem.edge.server import ExitZeroServer, configure_logging, uvicorn_config
from tandem.edge.settings import Settings
from tandem.serve.app import create_app
from tandem.serve.bounds import max_request_sequences
from tandem.serve.served import ServedModel, load_served_model

__all__ = ["run_server", "startup_banner", "describe_defaults", "TandemServer", "client_host"]

logger = logging.getLogger("tandem.serve")

# Once the gateway is gone: SIGTERM ourselves (its connections are closed, so in-flight requests
# end at once), and exit hard if the graceful shutdown has not finished by then.
ORPHAN_EXIT_AFTER_S = 5.0


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


def describe_defaults(defaults: Mapping[str, Any], source: str) -> str:
    """One line: what a request that omits sampling fields gets, and where that comes from."""
    if source != "auto":
        return "the OpenAI API's (--generation-config vllm)"
    if not defaults:
        return "the OpenAI API's (the model's generation_config.json sets none)"
    listed = ", ".join(f"{k}={v}" for k, v in defaults.items())
    return f"{listed} (the model's generation_config.json; --generation-config vllm for the OpenAI API's)"


def engine_threads(config: Settings) -> int:
    """The engine's torch threads: --threads, else every core (tandem.engine.EngineConfig's default)."""
    return config.threads or os.cpu_count() or 1


def startup_banner(config: Settings, served: ServedModel, port: int) -> str:
    base = f"http://{client_host(config.host)}:{port}"
    body = json.dumps({"model": served.name, "prompt": "def fibonacci(n):", "max_tokens": 64})
    auth = ' -H "Authorization: Bearer $TANDEM_API_KEY"' if config.api_key else ""
    return "\n".join(
        [
            f"tandem serve is ready at {base} (OpenAI API under {base}/v1)",
            f"  model:  {served.name} ({served.path}), context {served.max_model_len} tokens",
            f"  recipe: {served.recipe}",
            f"  threads: {engine_threads(config)} torch threads, OMP_WAIT_POLICY "
            f"{os.environ.get('OMP_WAIT_POLICY', 'unset (OpenMP threads spin while waiting)')}; port {port}",
            f"  slots:  {served.num_slots} running + {config.max_queue} queued sequences; one request at most "
            f"{max_request_sequences(served.num_slots + config.max_queue, config.max_request_share)} "
            f"(--max-request-share {config.max_request_share:g})",
            f"  sampling defaults: {describe_defaults(served.sampling_defaults, config.generation_config)}",
            "  try:",
            f"    curl {base}/v1/completions -H 'Content-Type: application/json'{auth} \\",
            f"      -d '{body}'",
        ]
    )


def _leave() -> None:
    """The gateway that started this replica is gone: shut down gracefully, exit hard if that hangs."""
    os.kill(os.getpid(), signal.SIGTERM)
    backstop = threading.Timer(ORPHAN_EXIT_AFTER_S, os._exit, args=(1,))
    backstop.daemon = True  # a clean shutdown before then exits normally
    backstop.start()


def run_server(config: Settings, load: Callable[[], ServedModel] | None = None) -> int:
    """Serve until SIGTERM/SIGINT. Returns the exit code: 0 after a clean shutdown, 1 if loading failed."""
    configure_logging(config.log_level)
    if config.parent_pid is not None:
        watch_parent(config.parent_pid, _leave)
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
    uv_config = uvicorn_config(app, config, shutdown_timeout_s=config.shutdown_timeout)
    server = TandemServer(uv_config, app.state.tandem.drain, config.shutdown_timeout)
    logger.info(
        "tandem serve: loading the model (%s) on %s:%d", config.model or "bundled default", config.host, config.port
    )
    server.run()
    return exit_code
