"""run_gateway: the gateway process under uvicorn, its signals and its exit code.

- SIGTERM/SIGINT: stop admitting (new and waiting requests get 503 at once), let in-flight requests
  finish for up to the drain deadline (`shutdown_timeout_s`), stop the replicas, exit 0.
- A second signal: stop waiting for in-flight requests, stop the replicas now, exit 0; no traceback.
- The primary variant can never start (a bad recipe): log the replica's own error and exit 1.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Generator
from types import FrameType

import uvicorn

from tandem.edge.server import ExitZeroServer, configure_logging, uvicorn_config
from tandem.edge.settings import Settings
from tandem.gateway.app import create_gateway_app, stop_replicas
from tandem.gateway.model_backend import shared_backend
from tandem.gateway.wiring import Gateway

__all__ = ["GatewayServer", "run_gateway"]

logger = logging.getLogger("tandem.gateway")


class GatewayServer(ExitZeroServer):
    def __init__(self, config: uvicorn.Config, gw: Gateway) -> None:
        super().__init__(config)
        self.gw = gw
        self.exit_code = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        if not self.should_exit:
            logger.info(
                "%s: admitting no new requests; waiting ones get 503, in-flight ones get up to %g s; then the "
                "replicas stop",
                name, self.gw.shutdown_timeout_s,
            )  # fmt: skip
            self._begin_drain()
            self.should_exit = True
        elif not self.force_exit:
            logger.warning("%s again: stopping now", name)
            self.force_exit = True
        else:
            logger.info("%s: already stopping", name)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """Route SIGTERM/SIGINT here until the process ends: a signal during the final cleanup (after
        uvicorn returned) must not fall back to Python's default and end in a KeyboardInterrupt."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, self.handle_exit)
        yield

    def fail(self, message: str) -> None:
        """The gateway cannot serve (its primary never starts): exit 1 with the replica's own error."""
        logger.error("the gateway gives up: %s", message)
        self.exit_code = 1
        self.should_exit = True

    def _begin_drain(self) -> None:
        # A signal handler runs between bytecodes of the event loop's thread: hand the work to the loop.
        loop = getattr(self, "_gateway_loop", None)
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self.gw.begin_drain)
        else:
            self.gw.draining = True

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        import asyncio

        self._gateway_loop = asyncio.get_running_loop()
        await super().serve(sockets)


def run_gateway(
    gw: Gateway, settings: Settings, *, log_dir: str | None = None, backend: str = "local processes on this machine"
) -> int:
    """Serve until SIGTERM/SIGINT (exit 0), or until the primary variant gives up (exit 1)."""
    configure_logging(settings.log_level)
    names = ", ".join(f"{p.variant.name} ({p.variant.recipe or 'default recipe'})" for p in gw.deployment.plans)
    logger.info(
        "tandem gateway on http://%s:%d: variants %s; primary %s, fallback %s, policy %s; replicas: %s; replica "
        "logs in %s",
        settings.host, settings.port, names, gw.deployment.primary, gw.deployment.fallback,
        gw.deployment.policy_name, backend,
        f"{log_dir}{' on each replica node' if gw.deployment.backend.name == 'ray' else ''}",
    )  # fmt: skip
    for name, part in gw.models.items():
        variants = ", ".join(f"{p.variant.name} ({p.variant.recipe or 'default'})" for p in part.deployment.plans)
        logger.info("model %s: variants %s; primary %s, policy %s", name, variants, part.deployment.primary,
                    part.deployment.policy_name)  # fmt: skip
    server: GatewayServer | None = None

    def on_fatal(message: str) -> None:
        if server is not None:
            server.fail(message)

    app = create_gateway_app(
        gw, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout,
        max_header_bytes=settings.max_header_bytes, on_fatal=on_fatal,
    )  # fmt: skip
    # Each client connection may hold one to a replica as well: two descriptors per connection.
    config = uvicorn_config(app, settings, shutdown_timeout_s=gw.shutdown_timeout_s, per_connection_fds=2)
    server = GatewayServer(config, gw)
    server.run()
    stop_replicas(
        shared_backend(gw.fleet.backend), wait_s=5.0
    )  # after a second signal uvicorn skipped the app's shutdown; else a no-op
    return server.exit_code
