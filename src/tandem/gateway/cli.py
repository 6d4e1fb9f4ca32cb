"""`tandem serve` in gateway mode: Settings (flags, file, TANDEM_*) -> a Deployment -> a running gateway.

Kept apart from the app and the proxy, so the request path reads without the command-line plumbing.
Bad settings, a bad deployment file or a profile that cannot be measured end in one line and exit 1.
"""

from __future__ import annotations

from pathlib import Path

import click

from tandem.cluster.backend import BackendError
from tandem.cluster.choice import choose_backend, refuse_the_gateways_port
from tandem.deployment import DeploymentError
from tandem.deployment.fleet_settings import fleet_from_settings
from tandem.edge.redact import redact_secrets_in_logs
from tandem.edge.settings import Settings
from tandem.gateway.models import build_fleet_gateway
from tandem.gateway.run import run_gateway
from tandem.gateway.tenant_cli import tenancy_from_settings
from tandem.gateway.wiring import default_log_dir, new_fleet_secret
from tandem.schedule.profiles import ProfileError, cached_profile

__all__ = ["serve_gateway"]


def serve_gateway(settings: Settings) -> int:
    """Build the deployment and the gateway from `settings`, then serve. Returns the exit code."""
    try:
        refuse_the_gateways_port(settings)  # before any profile is measured or replica tried
        plan = fleet_from_settings(settings, profile=cached_profile)  # measures what the cache lacks
    except (BackendError, DeploymentError, ProfileError) as exc:
        raise click.ClickException(str(exc)) from None
    log_dir = Path(settings.log_dir) if settings.log_dir else default_log_dir()
    secret = new_fleet_secret()  # this fleet's alone; replicas get it in their environment
    redact_secrets_in_logs(secret)  # whatever a template or a replica's output makes of it (tandem.edge.redact)
    try:
        backend, where = choose_backend(
            settings, plan.backend.name, plan.backend.address, log_dir, fleet_secret=secret,
            memory_bytes=plan.nodes.memory_bytes,  # the file's nodes.memory (None: this machine's RAM less a margin)
        )  # fmt: skip
    except BackendError as exc:
        raise click.ClickException(str(exc)) from None
    gw = build_fleet_gateway(  # one model: build_gateway; several: one Gateway each (tandem.gateway.models)
        plan,
        backend,
        buffer_timeout_s=settings.queue_timeout,
        shutdown_timeout_s=settings.shutdown_timeout,
        first_byte_timeout_s=settings.first_byte_timeout,
        stream_idle_timeout_s=settings.stream_idle_timeout,
        max_resumes=settings.max_resumes,
        fleet_secret=secret,
        gate_log_dir=log_dir,
    )
    tenancy_from_settings(gw, settings)  # keys -> tenants, limits, fair queue, usage ledger
    return run_gateway(gw, settings, log_dir=str(log_dir), backend=where)
