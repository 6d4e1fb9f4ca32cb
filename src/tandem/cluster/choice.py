"""Which backend a gateway process starts its replicas with: local processes on this machine (the
default) or a Ray cluster, each handed the fleet's secret in the replicas' environment and the
gateway's settings (`tandem.edge.settings`) it needs: ports, log folder, drain time.

Ray (`tandem[ray]`) is imported only here, and only for the `ray` backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tandem.cluster.backend import Backend, BackendError
from tandem.cluster.external import FLEET_SECRET_ENV
from tandem.cluster.local import LocalBackend, PortRange, find_free_port, popen_spawner
from tandem.edge.settings import Settings, settings_environment, settings_variables

__all__ = ["choose_backend", "local_backend", "refuse_the_gateways_port", "replica_environment"]


def replica_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The gateway's environment minus its TANDEM_* settings: a replica gets its settings as flags.

    Without this a TANDEM_REPLICAS_MAX meant for the gateway would make every replica a gateway too.
    """
    settings = settings_environment(environ)
    return {k: v for k, v in environ.items() if k not in settings}


def local_backend(
    settings: Settings,
    log_dir: Path,
    environ: Mapping[str, str] | None = None,
    fleet_secret: str | None = None,
    memory_bytes: int | None = None,
) -> LocalBackend:
    """Replicas as local processes: logs under `log_dir`, ports from --replica-ports (or any free one),
    the fleet's secret in their environment, `memory_bytes` of this machine for them (`nodes.memory`;
    None: its RAM less a margin, tandem.cluster.room)."""
    ports = PortRange(*settings.replica_ports) if settings.replica_ports else find_free_port
    env = replica_environment(os.environ if environ is None else environ)
    if fleet_secret is not None:
        env[FLEET_SECRET_ENV] = fleet_secret
    return LocalBackend(
        spawn=popen_spawner(log_dir),
        ports=ports,
        base_env=env,
        # Longer than a replica's own drain (its --shutdown-timeout), so SIGKILL is the exception.
        kill_after_s=settings.shutdown_timeout + 10.0,
        memory_bytes=memory_bytes,
    )


def refuse_the_gateways_port(settings: Settings) -> None:
    """BackendError when the replicas' port range holds the gateway's own port: a replica could never
    take it (the gateway holds it), and a range of that port alone would never start one at all."""
    if settings.replica_ports is None or settings.port == 0:
        return
    low, high = settings.replica_ports
    if low <= settings.port <= high:
        raise BackendError(
            f"--replica-ports {low}-{high} holds the gateway's own port {settings.port} (--port): give the "
            "replicas a range without it"
        )


def choose_backend(
    settings: Settings,
    name: str,
    address: str | None,
    log_dir: Path,
    environ: Mapping[str, str] | None = None,
    fleet_secret: str | None = None,
    memory_bytes: int | None = None,
) -> tuple[Backend, str]:
    """The backend `name` ("local" or "ray", the deployment's `backend:`; `address`: the Ray cluster's),
    and a line for the banner saying where replicas run; either way the replicas get `fleet_secret`
    in their environment; `memory_bytes`: the local budget (Ray nodes report their own memory).
    BackendError when Ray is missing or its cluster cannot be reached.
    """
    if name != "ray":
        backend = local_backend(settings, log_dir, environ, fleet_secret, memory_bytes)
        return backend, "local processes on this machine"
    from tandem.cluster.ray import ray_backend

    try:
        backend = ray_backend(
            address, log_dir=str(log_dir), ports=settings.replica_ports,
            # What a replica's node must not pass on: the gateway's own TANDEM_* settings (as locally).
            unset_env=settings_variables(), kill_after_s=settings.shutdown_timeout + 10.0,
            extra_env={FLEET_SECRET_ENV: fleet_secret} if fleet_secret is not None else None,
        )  # fmt: skip
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "ray":
            raise
        raise BackendError("the ray backend needs Ray: pip install 'tandem[ray]'") from None
    return backend, f"Ray: {backend.description}"
