"""The server's flags on `tandem serve` (click only: `tandem --help` imports this and nothing heavy).

Every flag is also a setting in a config file (`--config FILE`, the flags' names) and a TANDEM_*
environment variable; flags win over variables, which win over the file (tandem.edge.settings).
The command itself is tandem.cli's `serve`, which adds the connection flags and the gateway's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["server_options"]

_OPTIONS = [
    click.option("--model", default=None, help="Model directory or Hugging Face id org/name[@rev] (default: bundled)."),
    click.option("--recipe", default=None, help="Optimizer recipe, e.g. 'bf16' (default: the bench's best)."),
    click.option("--host", default=None, help="Address to bind.  [default: 127.0.0.1]"),
    click.option(
        "--port", type=click.IntRange(0, 65535), default=None, help="Port (0: any free one).  [default: 8000]"
    ),
    click.option(
        "--api-key", default=None, help="Require 'Authorization: Bearer KEY' on /v1 (and the gateway's /admin)."
    ),
    click.option(
        "--config",
        "config_file",
        type=click.Path(),
        default=None,
        help="YAML or JSON file of settings (the names of these flags); or set TANDEM_CONFIG.",
    ),
    click.option("--served-model-name", default=None, help="Name clients send as 'model' (default: the directory's)."),
    click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default=None, help="Weights dtype."),
    click.option(
        "--generation-config",
        type=click.Choice(["auto", "vllm"]),
        default=None,
        help="Defaults for omitted sampling fields: 'auto' from the model's generation_config.json, 'vllm' the "
        "OpenAI API's (temperature 1).  [default: auto]",
    ),
    click.option(
        "--tool-call-parser",
        type=click.Choice(["hermes"]),
        default=None,
        help="How tool_choice 'auto' reads the model's tool calls: hermes, <tool_call>{json}</tool_call> "
        "(default: none; 'required' and named functions need none).",
    ),
    click.option(
        "--max-model-len",
        type=click.IntRange(min=2),
        default=None,
        help="Context per sequence (default: the model's, at most 2048).",
    ),
    click.option(
        "--kv-cache-tokens",
        type=click.IntRange(min=2),
        default=None,
        help="KV memory budget in tokens.  [default: 32768]",
    ),
    click.option(
        "--max-num-seqs", type=click.IntRange(min=1), default=None, help="Sequences running at once.  [default: 64]"
    ),
    click.option(
        "--max-prefill-tokens",
        type=click.IntRange(min=1),
        default=None,
        help="Prompt tokens prefilled per engine step.  [default: 512]",
    ),
    click.option(
        "--max-queue",
        type=click.IntRange(min=0),
        default=None,
        help="Sequences allowed to wait (then 429).  [default: 256]",
    ),
    click.option(
        "--max-body-bytes",
        type=click.IntRange(min=256),
        default=None,
        help="Larger bodies get 413.  [default: 1048576]",
    ),
    click.option(
        "--max-n", type=click.IntRange(min=1), default=None, help="Most choices per prompt (n).  [default: 16]"
    ),
    click.option(
        "--max-request-share",
        type=click.FloatRange(min=0, max=1, min_open=True),
        default=None,
        help="Most of the running slots and queue one request (prompts x n) may hold; more is a 400.  [default: 0.25]",
    ),
    click.option(
        "--retry-after-s", type=click.IntRange(min=0), default=None, help="Retry-After sent with a 429.  [default: 1]"
    ),
    click.option(
        "--shutdown-timeout",
        type=click.FloatRange(min=0),
        default=None,
        help="Seconds in-flight requests get to finish after SIGTERM.  [default: 30]",
    ),
    click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads (default: all cores)."),
    click.option(
        "--enable-prefix-caching/--no-enable-prefix-caching",
        default=None,
        help="Reuse the KV cache of identical prompt prefixes.  [default: enabled]",
    ),
    click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None),
    click.option("--access-log/--no-access-log", default=None, help="Log one line per request."),
    click.option(
        "--metrics-prefix",
        type=click.Choice(["tandem", "vllm"]),
        default=None,
        help="/metrics names: tandem:<name>, or vllm:<name> for vLLM's dashboards and rules.  [default: tandem]",
    ),
    # Set by a gateway on the replicas it starts: who they are (GET /load reports it) and whom they outlive.
    click.option("--replica-id", default=None, hidden=True),
    click.option("--replica-region", default=None, hidden=True),
    click.option("--replica-variant", default=None, hidden=True),
    click.option("--parent-pid", type=click.IntRange(min=1), default=None, hidden=True),
]


def server_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the server's flags to a click command (`tandem serve`): one replica's, of which the host, the
    port, the API key and the config file are the gateway's too."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command
