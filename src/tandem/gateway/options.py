"""The gateway's flags on `tandem serve` (click only: `tandem --help` imports this and nothing heavy).

Any of --deployment, --replicas-min, --replicas-max, --policy, --fallback, --regions, --backend,
--ray-address or --shadow (from a flag, the config file or a TANDEM_* variable) makes `tandem serve` a gateway;
the others tune one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

__all__ = ["gateway_options"]


def _print_deployment_schema(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from tandem.deployment import deployment_schema

    click.echo(json.dumps(deployment_schema(), indent=2))
    ctx.exit(0)


_OPTIONS = [
    click.option("--deployment", type=click.Path(), default=None, help="Gateway: deployment file (YAML) of variants."),
    click.option("--replicas-min", type=click.IntRange(min=0), default=None, help="Gateway: fewest primary replicas."),
    click.option("--replicas-max", type=click.IntRange(min=1), default=None, help="Gateway: most primary replicas."),
    click.option("--policy", type=click.Choice(["hpa", "kpa", "capacity"]), default=None, help="Gateway: autoscaler."),
    click.option("--fallback", default=None, help="Gateway: recipe (or variant) that re-runs failed requests."),
    click.option("--regions", default=None, help="Gateway: comma-separated regions to place replicas in."),
    click.option(
        "--log-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Gateway: one log file per replica here.  [default: ~/.cache/tandem/logs/gateway-<time>-<pid>]",
    ),
    click.option(
        "--replica-ports", default=None, help="Gateway: replica ports from this range, e.g. 9000-9099 (default: any)."
    ),
    click.option(
        "--queue-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Gateway: seconds a request waits for a replica, then 503.  [default: 60]",
    ),
    click.option(
        "--backend",
        type=click.Choice(["local", "ray"]),
        default=None,
        help="Gateway: where replicas run: processes on this machine, or a Ray cluster.  [default: local]",
    ),
    click.option(
        "--node-memory-gb",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Gateway: GiB of this machine's memory for replicas (a replica that does not fit waits); over the "
        "file's nodes.memory.  [default: its RAM less 10% or 1 GiB]",
    ),
    click.option(
        "--ray-address",
        default=None,
        help="Gateway: the Ray cluster (HOST:6379, or auto); implies --backend ray.  [default: RAY_ADDRESS, else "
        "the cluster `ray start` left on this machine, else a new local one]",
    ),
    click.option(
        "--first-byte-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Gateway: seconds to a stream's first chunk (a non-streaming answer: a replica health check). "
        "Past it the replica is asked: one that does not answer is skipped and the request re-run; one that does "
        "is fine and the request alone is re-run once elsewhere, then answered 504.  [default: 30]",
    ),
    click.option(
        "--stream-idle-timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="Gateway: the longest pause between a stream's chunks (then that stream ends with an error event; "
        "its replica is skipped only if it does not answer its health check or no stream on it moves).  "
        "[default: 30]",
    ),
    click.option(
        "--max-resumes",
        type=click.IntRange(min=0),
        default=None,
        help="Gateway: how often one stream that breaks mid-way (its replica died, froze or failed, a drain's "
        "deadline) is resumed on another replica or the fallback; past it the stream ends with an error event; "
        "0: never resume.  [default: 2]",
    ),
    click.option(
        "--shadow",
        default=None,
        metavar="RECIPE",
        help="Gateway: mirror a share of live requests to a candidate variant of RECIPE and let the validation "
        "gate judge it (latency, accuracy, unit cost); on PASS it is promoted.",
    ),
    click.option(
        "--shadow-fraction",
        type=click.FloatRange(min=0, max=1, min_open=True),
        default=None,
        help="Gateway: share of requests mirrored to the --shadow candidate.  [default: 0.2]",
    ),
    click.option(
        "--tenants",
        type=click.Path(dir_okay=False),
        default=None,
        help="Gateway: tenants file (YAML: keys, priority, limits, budgets, models); reloaded on SIGHUP and "
        "POST /admin/tenants/reload.  [default: one anonymous tenant, holding --api-key]",
    ),
    click.option(
        "--usage-db",
        default=None,
        metavar="PATH|URL",
        help="Gateway: the usage ledger, a SQLite file or postgresql://user@host/db.  [default: "
        "~/.cache/tandem/usage.db]",
    ),
    click.option(
        "--print-deployment-schema",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_print_deployment_schema,
        help="Print the deployment file's JSON Schema and exit.",
    ),
]


def gateway_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the gateway's flags to a click command (`tandem serve`)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
