"""`tandem serve`: the OpenAI-compatible server. Flags override --config FILE, which overrides defaults."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tandem.serve.config import ConfigError, ServerConfig, build_config

__all__ = ["serve", "preflight"]

# Flags that switch `tandem serve` into gateway mode; they configure the deployment, not ServerConfig.
GATEWAY_FLAGS = ("deployment", "replicas_min", "replicas_max", "policy", "fallback", "regions")


def preflight(config: ServerConfig) -> None:
    """Cheap checks before the server starts, so a typo is a one-line error, not a failed load later."""
    from tandem.model import default_model_dir
    from tandem.optimize import RecipeError, parse_recipe
    from tandem.serve.served import resolve_recipe

    model_dir = Path(config.model) if config.model else default_model_dir()
    if not model_dir.is_dir():
        hint = "" if config.model else " (the bundled default model is not built; pass --model DIR)"
        raise click.ClickException(f"{model_dir}: model directory does not exist{hint}")
    try:
        parse_recipe(resolve_recipe(config.recipe))
    except RecipeError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option("--model", type=click.Path(), default=None, help="HF model directory (default: the bundled model).")
@click.option("--recipe", default=None, help="Optimizer recipe, e.g. 'bf16' (default: the bench's best).")
@click.option("--host", default=None, help="Address to bind.  [default: 127.0.0.1]")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (0: any free one).  [default: 8000]")
@click.option(
    "--api-key",
    envvar="TANDEM_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1 routes (or set TANDEM_API_KEY).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(),
    default=None,
    help="YAML or JSON file of settings (the names of these flags, with underscores).",
)
@click.option("--served-model-name", default=None, help="Name clients send as 'model' (default: the directory's).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default=None, help="Weights dtype.")
@click.option(
    "--max-model-len",
    type=click.IntRange(min=2),
    default=None,
    help="Context per sequence (default: the model's, at most 2048).",
)
@click.option(
    "--kv-cache-tokens", type=click.IntRange(min=2), default=None, help="KV memory budget in tokens.  [default: 32768]"
)
@click.option(
    "--max-num-seqs", type=click.IntRange(min=1), default=None, help="Sequences running at once.  [default: 64]"
)
@click.option(
    "--max-queue",
    type=click.IntRange(min=0),
    default=None,
    help="Sequences allowed to wait (then 429).  [default: 256]",
)
@click.option(
    "--max-body-bytes", type=click.IntRange(min=256), default=None, help="Larger bodies get 413.  [default: 1048576]"
)
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds in-flight requests get to finish after SIGTERM.  [default: 30]",
)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads (default: all cores).")
@click.option(
    "--enable-prefix-caching/--no-enable-prefix-caching",
    default=None,
    help="Reuse the KV cache of identical prompt prefixes.  [default: enabled]",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
@click.option("--access-log/--no-access-log", default=None, help="Log one line per request.")
# Gateway mode (any of these): a router and an autoscaler in front of local replicas (tandem.serve.gateway).
@click.option("--deployment", type=click.Path(), default=None, help="Gateway: deployment file (YAML) of variants.")
@click.option("--replicas-min", type=click.IntRange(min=0), default=None, help="Gateway: fewest primary replicas.")
@click.option("--replicas-max", type=click.IntRange(min=1), default=None, help="Gateway: most primary replicas.")
@click.option("--policy", type=click.Choice(["hpa", "kpa", "capacity"]), default=None, help="Gateway: autoscaler.")
@click.option("--fallback", default=None, help="Gateway: recipe (or variant) that re-runs failed requests.")
@click.option("--regions", default=None, help="Gateway: comma-separated regions to place replicas in.")
def serve(config_file: str | None, **flags) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, metrics)."""
    gateway = {name: flags.pop(name) for name in GATEWAY_FLAGS}
    try:
        config = build_config(config_file, flags)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if any(value is not None for value in gateway.values()):
        from tandem.serve.gateway_cli import serve_gateway

        sys.exit(serve_gateway(config, gateway.pop("deployment"), **gateway))
    preflight(config)
    from tandem.serve.server import run_server

    sys.exit(run_server(config))
