"""Tenancy from the gateway's settings (`--tenants`, `--api-key`, `--usage-db`), SIGHUP to reload the
tenants file, and the two commands: `tandem keys new` (a key and its hash) and `tandem usage`
(the ledger's sums as a table or CSV)."""

from __future__ import annotations

import csv
import io
import logging
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path

import click

from tandem.deployment.tenants import TenantsError, anonymous_tenants, load_tenants, new_key
from tandem.edge.settings import Settings
from tandem.gateway.ledger import GROUPS, Ledger, LedgerError, default_usage_db, moment_from
from tandem.gateway.tenancy import Tenancy
from tandem.gateway.tenant_app import enable_tenancy
from tandem.gateway.wiring import Gateway

__all__ = ["keys_command", "tenancy_from_settings", "usage_command"]

logger = logging.getLogger("tandem.gateway")


def tenancy_from_settings(gw: Gateway, settings: Settings) -> Tenancy:
    """Tenants from `--tenants` (else one anonymous tenant holding `--api-key`), usage into `--usage-db`
    (else the cache's SQLite file); SIGHUP re-reads the tenants file. A bad file or database: exit 1."""
    try:
        if settings.tenants is not None:
            if settings.api_key:
                raise click.ClickException("give --tenants or --api-key, not both (a tenants file holds every key)")
            tenants = load_tenants(settings.tenants)
        else:
            tenants = anonymous_tenants(settings.api_key)
        ledger = Ledger(settings.usage_db or default_usage_db())
    except (TenantsError, LedgerError) as exc:
        raise click.ClickException(str(exc)) from None
    tenancy = enable_tenancy(gw, tenants, ledger, path=Path(settings.tenants) if settings.tenants else None)
    logger.info("tenants: %s (from %s); usage ledger: %s", ", ".join(tenants.names()), tenants.source, ledger.where)
    if tenancy.path is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, lambda *_: _reload(tenancy))
    return tenancy


def _reload(tenancy: Tenancy) -> None:
    try:
        tenancy.reload()
    except TenantsError as exc:
        logger.error("SIGHUP: %s; the tenants in use are unchanged", exc)


@click.group("keys")
def keys_command() -> None:
    """API keys for the gateway's tenants file (tandem keys new)."""


@keys_command.command("new")
def keys_new() -> None:
    """Print a new random API key (give it to the tenant) and its hash (put it in the tenants file)."""
    key, digest = new_key()
    click.echo(f"key:  {key}")
    click.echo(f"hash: {digest}")


def _time(value: str | None, name: str) -> float | None:
    try:
        return moment_from(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=name) from None


COLUMNS = ("period_start", "tenant", "model", "variant", "requests", "requests_by_status", "prompt_tokens",
           "completion_tokens", "replica_seconds", "dollars")  # fmt: skip


@click.command("usage")
@click.option("--db", default=None, metavar="PATH|URL", help="The ledger (default: ~/.cache/tandem/usage.db).")
@click.option("--tenant", default=None)
@click.option("--model", default=None)
@click.option("--since", default=None, help="ISO 8601 or Unix seconds")
@click.option("--until", default=None, help="ISO 8601 or Unix seconds")
@click.option("--group-by", type=click.Choice(list(GROUPS)), default="day", show_default=True)
@click.option("--csv", "as_csv", is_flag=True, help="CSV on stdout instead of a table.")
def usage_command(db, tenant, model, since, until, group_by, as_csv) -> None:
    """What each tenant used per model and variant: requests, tokens, replica-seconds, dollars."""
    where = db or default_usage_db()
    if db is None and not Path(where).exists():
        raise click.ClickException(f"no usage ledger at {where} (a gateway writes one there; or give --db)")
    try:
        ledger = Ledger(where)
        rows = ledger.query(tenant, model, _time(since, "--since"), _time(until, "--until"), group_by)
        ledger.close()
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from None
    for row in rows:
        row["period_start"] = datetime.fromtimestamp(row["period_start"], UTC).strftime("%Y-%m-%dT%H:%MZ")
        row["requests_by_status"] = " ".join(f"{k}:{v}" for k, v in sorted(row["requests_by_status"].items()))
        row["replica_seconds"] = round(row["replica_seconds"], 3)
        row["dollars"] = round(row["dollars"], 6)
    if as_csv:
        out = io.StringIO()
        writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        click.echo(out.getvalue(), nl=False)
        return
    if not rows:
        click.echo("no usage recorded for that selection")
        return
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    click.echo("  ".join(c.ljust(widths[c]) for c in COLUMNS))
    for row in rows:
        click.echo("  ".join(str(row[c]).ljust(widths[c]) for c in COLUMNS))
