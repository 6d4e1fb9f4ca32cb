"""The connection flags of `tandem serve`, for both apps (click only: `tandem --help` imports this).

Each is also a config-file key and a TANDEM_* variable (tandem.edge.settings); what each bounds,
and why these and not uvicorn's `limit_concurrency`, is in tandem.edge.connections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["connection_options"]

_SECONDS = click.FloatRange(min=0, min_open=True)
_OPTIONS = [
    click.option(
        "--max-connections", type=click.IntRange(min=1), default=None,
        help="Connections open at once; past it the oldest idle or half-sent ones close.  [default: 4096]",
    ),
    click.option(
        "--header-timeout", type=_SECONDS, default=None,
        help="Seconds a connection may take to send a request's headers.  [default: 10]",
    ),
    click.option(
        "--body-timeout", type=_SECONDS, default=None,
        help="Seconds a request's whole body may take to arrive (then 408).  [default: 30]",
    ),
    click.option(
        "--keep-alive-timeout", type=_SECONDS, default=None,
        help="Seconds an idle keep-alive connection stays open.  [default: 5]",
    ),
    click.option(
        "--max-header-bytes", type=click.IntRange(min=1024), default=None,
        help="Largest request line and headers together (then 431).  [default: 16384]",
    ),
    click.option(
        "--backlog", type=click.IntRange(min=1), default=None,
        help="Connections the kernel queues before they are accepted (at most net.core.somaxconn).  [default: 4096]",
    ),
]  # fmt: skip


def connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the connection flags to a click command (`tandem serve`)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
