"""The `tandem` command: the one command layer. Bad input ends with a one-line message and a non-zero
exit, never a traceback.

`serve` and `profile` are here, because each picks between layers: `tandem serve` runs one replica's
server (tandem.serve) or, with gateway flags, the gateway in front of many (tandem.gateway);
`tandem profile` measures a recipe (tandem.optimize), imports GPU timings (tandem.data.splitwise) or
measures a running server black-box (tandem.measure). The other sub-commands live beside the code
they drive. Everything heavy is imported only when a command runs (`LazyGroup` for the others), so
`tandem --help` imports neither torch nor the optimizers, and `tandem serve` in gateway mode never
loads torch at all.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import click

from tandem.cli_help import GroupedOptionsCommand
from tandem.edge.options import connection_options
from tandem.gateway.options import gateway_options
from tandem.serve.options import server_options

__all__ = ["main", "cli", "LAZY_COMMANDS", "profile", "serve"]

# name -> (module:attribute, the command's one-line help as `tandem --help` lists it; a test keeps
# these equal to the commands' own).
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "zoo": ("tandem.zoo.cli:zoo", "The bundled models: build them from the Python standard library."),
    "optimizers": (
        "tandem.optimize.cli:optimizers_command",
        "List every registered optimizer (built-in and plug-in): version, description, parameters.",
    ),
    "gate": (
        "tandem.gate.cli:gate_command",
        "Run INCUMBENT and CANDIDATE side by side on the trace-shaped workload and judge latency, accuracy"
        " and unit cost.",
    ),
    "sim": (
        "tandem.sim.cli:sim_command",
        "Simulate a trace through every (variant, policy) pair: replica-hours, SLO attainment, cost.",
    ),
    "bench": (
        "tandem.optimize.cli:bench_command",
        "Run one trace-shaped workload through each recipe and through transformers; print ratios.",
    ),
    "keys": ("tandem.gateway.tenant_cli:keys_command", "API keys for the gateway's tenants file (tandem keys new)."),
    "usage": (
        "tandem.gateway.tenant_cli:usage_command",
        "What each tenant used per model and variant: requests, tokens, replica-seconds, dollars.",
    ),
}


class LazyGroup(click.Group):
    """A group whose sub-commands are imported when invoked; its listing needs none of them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in LAZY_COMMANDS:
            return super().get_command(ctx, name)
        module, _, attribute = LAZY_COMMANDS[name][0].partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except ModuleNotFoundError as exc:  # an optional part's dependency is missing: no such command
            if exc.name is None or not module.startswith(exc.name):
                raise
            return None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS:
                rows.append((name, LAZY_COMMANDS[name][1]))
            else:
                command = super().get_command(ctx, name)
                if command is not None and not command.hidden:
                    rows.append((name, command.get_short_help_str(limit=200)))  # whole, as the lazy ones'
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tandem")
def cli() -> None:
    """tandem: an LLM inference platform (optimization layer + scheduling layer)."""


@cli.command()
@click.argument("prompt_arg", metavar="[PROMPT]", required=False)
@click.option("--prompt", default=None, help="Text to complete (or give it as PROMPT, or on stdin).")
@click.option("--model", "model_dir", default=None, help="HF model directory or id org/name (default: bundled)")
@click.option("--recipe", default=None, help="Optimizer recipe, e.g. int8+ngram (default: what `tandem serve` serves).")
@click.option("--chat", is_flag=True, help="Treat the prompt as a user message (the model's chat template).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="[default: the model's, else 128]")
@click.option("--temperature", type=click.FloatRange(0, 100), default=None, help="0 = greedy [default: the model's]")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None, help="[default: the model's, 1]")
@click.option("--top-k", type=click.IntRange(min=0), default=None, help="[default: the model's, 0 = off]")
@click.option("--seed", type=click.IntRange(min=0), default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads (default: all cores)")
def generate(prompt_arg, prompt, model_dir, recipe, chat, max_tokens, temperature, top_p, top_k, seed, stop, dtype,
             threads) -> None:  # fmt: skip
    """Stream a completion of PROMPT to stdout (PROMPT, --prompt, or text piped on stdin).

    Sampling follows the model's generation_config.json where a flag is not given (greedy for
    the bundled model). With --chat the prompt is a user message and only the reply is printed.
    """
    text = prompt_arg if prompt_arg is not None else prompt
    if prompt_arg is not None and prompt is not None:
        raise click.UsageError("give the prompt once: as PROMPT or with --prompt")
    if text is None and not sys.stdin.isatty():
        text = sys.stdin.read()
    if not text:
        raise click.UsageError("no prompt: give PROMPT, --prompt TEXT, or pipe text on stdin")
    from tandem.optimize.cli import check_recipe
    from tandem.optimize.defaults import recipe_or_default

    recipe = check_recipe(recipe_or_default(recipe))
    from tandem.engine import Engine, EngineConfig, RequestError, SamplingParams
    from tandem.model import ChatTemplateError, ModelLoadError, load_model
    from tandem.model.generation_config import sampling_defaults
    from tandem.optimize import RecipeError, apply_recipe

    try:
        model = load_model(model_dir, dtype=dtype)
        given = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k}
        defaults = {"max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": 0}
        defaults.update({k: v for k, v in sampling_defaults(model.generation_defaults).items() if k in defaults})
        params = SamplingParams(
            **{k: v if v is not None else defaults[k] for k, v in given.items()}, seed=seed, stop=stop
        )
        engine_input = model.tokenizer.apply_chat_template([{"role": "user", "content": text}]) if chat else text
        engine = Engine(apply_recipe(model, recipe), EngineConfig(num_threads=threads, max_num_seqs=1))
        engine.add_request(engine_input, params)
    except (ModelLoadError, RecipeError, RequestError, ChatTemplateError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    out = sys.stdout
    if not chat:
        out.write(text)
    while engine.has_unfinished():
        for step_out in engine.step():
            out.write(step_out.new_text)
            out.flush()
    out.write("\n")


@cli.command(cls=GroupedOptionsCommand)  # --help in groups: model, engine, server, gateway
@server_options
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
    from tandem.edge.settings import ConfigError, load_settings

    # Before torch loads OpenMP: its threads sleep while they wait instead of spinning on cores a
    # client or another replica needs (benchmarks/bench_threads.py; docs/server.md). Set it to override.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        config = load_settings(config_file, flags)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if config.gateway_mode:
        from tandem.gateway.cli import serve_gateway

        sys.exit(serve_gateway(config))
    from tandem.serve.preflight import preflight

    preflight(config)
    from tandem.serve.quick_exit import exit_now
    from tandem.serve.server import run_server

    exit_now(run_server(config))


@cli.command("profile")
@click.option("--model", "model_dir", type=click.Path(), default=None, help="HF model directory (default: bundled)")
@click.option(
    "--recipe",
    default=None,
    help="e.g. int8+speculative(k=4) (default: the recipe `tandem serve` serves, the bench's best)",
)
@click.option("--batch-sizes", default="1,2,4,8,16,32", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None)
@click.option("--threads", type=click.IntRange(min=1), default=None)
@click.option(
    "--from-splitwise",
    "splitwise",
    metavar="MODEL/HARDWARE",
    default=None,
    help="Build the Profile from the bundled splitwise GPU timings instead (e.g. llama2-70b/h100-80gb).",
)
@click.option("--tensor-parallel", type=click.IntRange(min=1), default=None, help="splitwise: accelerators per replica")
@click.option(
    "--cold-start-s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="splitwise, endpoint: seconds a replica takes to start (not measured; a large model takes about a minute)",
)
@click.option(
    "--speedup", type=click.FloatRange(min=0, min_open=True), default=1.0, help="splitwise: project x this speed"
)
@click.option("--weight-bits", type=click.Choice(["16", "8", "4"]), default="16", help="splitwise: project the weights")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar (there is none when stderr is not a terminal)")
@click.option("--endpoint", metavar="URL", default=None, help="Measure a running OpenAI-compatible server black-box.")
@click.option("--concurrency", default="1,4,8,16,32", show_default=True, help="endpoint: concurrency levels")
@click.option("--hardware", default=None, help="endpoint: what it runs on, for the Profile (e.g. h100-80gb)")
@click.option("--api-key", envvar="TANDEM_ENDPOINT_API_KEY", default=None, help="endpoint: its bearer token")
def profile(
    model_dir, recipe, batch_sizes, output, threads, splitwise, tensor_parallel, cold_start_s, speedup, weight_bits,
    quiet, endpoint, concurrency, hardware, api_key,
) -> None:  # fmt: skip
    """Measure a recipe's Profile (throughput by batch size, TTFT, memory, cold start), or import one.

    With --from-splitwise the Profile is built from measured GPU timings (source "imported"; with
    --speedup or --weight-bits, "projected" and the factor is stated in the Profile). With
    --endpoint URL any running OpenAI-compatible server (vLLM, SGLang, llama.cpp) is measured
    black-box over HTTP (--model: the name it serves; default: the first of GET /v1/models).
    """
    if endpoint:
        from tandem.measure.endpoint import profile_endpoint_cli

        given = click.get_current_context().get_parameter_source("cold_start_s").name != "DEFAULT"
        try:
            measured = profile_endpoint_cli(
                endpoint, model_dir, concurrency, cold_start_s if given else 0.0, hardware, api_key,
                lambda line: click.echo(line, err=True),
            )  # fmt: skip
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    elif splitwise:
        from tandem.data.splitwise import splitwise_profile

        projected = speedup != 1.0 or weight_bits != "16"
        try:
            measured = splitwise_profile(
                splitwise,
                tensor_parallel=tensor_parallel,
                cold_start_s=cold_start_s,
                speedup=speedup,
                weight_bits=int(weight_bits),
                recipe=recipe if projected and recipe != "baseline" else None,
            )
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    else:
        from tandem.optimize.cli import profile_recipe

        measured = profile_recipe(model_dir, recipe, batch_sizes, threads, quiet)
    text = measured.to_json()
    if output:
        Path(output).write_text(text + "\n")
    click.echo(text)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
