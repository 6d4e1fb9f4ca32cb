"""`tandem serve`: one replica's OpenAI-compatible server, or (with gateway flags) the gateway in front of many.

Every flag is also a setting in a config file (`--config FILE`, the flags' names) and a TANDEM_*
environment variable; flags win over variables, which win over the file (tandem.edge.settings).
The gateway's own flags live beside it (tandem.gateway.options); in gateway mode this process
never imports torch.
"""

from __future__ import annotations

import sys

import click

from tandem.edge.options import connection_options
from tandem.edge.settings import ConfigError, Settings, load_settings
from tandem.gateway.options import gateway_options

__all__ = ["serve", "preflight"]


def preflight(config: Settings) -> None:
    """Cheap checks before the server starts, so a typo is a one-line error, not a failed load later.

    The recipe's optimizers are built (not applied): a bad parameter (`speculative(q=3)`) fails here,
    in seconds, rather than after the model loaded.
    """
    from tandem.model import ModelLoadError
    from tandem.model.hub import resolve_model
    from tandem.optimize.cli import check_recipe
    from tandem.serve.served import resolve_recipe

    check_recipe(resolve_recipe(config.recipe))  # one line and exit 2, as every command reports a bad recipe
    try:
        resolve_model(config.model)  # a directory, or a Hugging Face id fetched into (or found in) its cache
    except ModelLoadError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.option("--model", default=None, help="Model directory or Hugging Face id org/name[@rev] (default: bundled).")
@click.option("--recipe", default=None, help="Optimizer recipe, e.g. 'bf16' (default: the bench's best).")
@click.option("--host", default=None, help="Address to bind.  [default: 127.0.0.1]")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (0: any free one).  [default: 8000]")
@click.option("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on /v1 (and the gateway's /admin).")
@click.option(
    "--config",
    "config_file",
    type=click.Path(),
    default=None,
    help="YAML or JSON file of settings (the names of these flags); or set TANDEM_CONFIG.",
)
@click.option("--served-model-name", default=None, help="Name clients send as 'model' (default: the directory's).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default=None, help="Weights dtype.")
@click.option(
    "--generation-config",
    type=click.Choice(["auto", "vllm"]),
    default=None,
    help="Defaults for omitted sampling fields: 'auto' from the model's generation_config.json, 'vllm' the "
    "OpenAI API's (temperature 1).  [default: auto]",
)
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
    "--max-prefill-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Prompt tokens prefilled per engine step.  [default: 512]",
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
@click.option("--max-n", type=click.IntRange(min=1), default=None, help="Most choices per prompt (n).  [default: 16]")
@click.option(
    "--max-request-share",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=None,
    help="Most of the running slots and queue one request (prompts x n) may hold; more is a 400.  [default: 0.25]",
)
@click.option(
    "--retry-after-s", type=click.IntRange(min=0), default=None, help="Retry-After sent with a 429.  [default: 1]"
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
@click.option(
    "--metrics-prefix",
    type=click.Choice(["tandem", "vllm"]),
    default=None,
    help="/metrics names: tandem:<name>, or vllm:<name> for vLLM's dashboards and rules.  [default: tandem]",
)
# Set by a gateway on the replicas it starts: who they are (GET /load reports it) and whom they outlive.
@click.option("--replica-id", default=None, hidden=True)
@click.option("--replica-region", default=None, hidden=True)
@click.option("--replica-variant", default=None, hidden=True)
@click.option("--parent-pid", type=click.IntRange(min=1), default=None, hidden=True)
@connection_options
@gateway_options
def serve(config_file: str | None, **flags) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, metrics).

    With --replicas-min/--replicas-max/--policy/--fallback/--regions/--deployment/--backend: a gateway
    that routes, autoscales and falls back over replicas (each a plain `tandem serve`, on this machine
    or, with --backend ray, across a Ray cluster).

    Every flag is also a key of the --config file (max_num_seqs: 8) and a TANDEM_* environment
    variable (TANDEM_MAX_NUM_SEQS=8); flags win over variables, variables over the file.
    """
    try:
        config = load_settings(config_file, flags)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if config.gateway_mode:
        from tandem.gateway.cli import serve_gateway

        sys.exit(serve_gateway(config))
    preflight(config)
    from tandem.serve.server import run_server

    sys.exit(run_server(config))
