"""The `tandem` command. Bad input ends with a one-line message and a non-zero exit, never a traceback.

Sub-commands live beside the code they drive and are imported only when run (`LazyGroup`), so
`tandem --help` imports neither torch nor the optimizers, and `tandem serve` in gateway mode never
loads torch at all.
"""

from __future__ import annotations

import importlib
import sys

import click

__all__ = ["main", "cli", "LAZY_COMMANDS"]

# name -> (module:attribute, the command's one-line help as `tandem --help` lists it; a test keeps
# these equal to the commands' own).
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "serve": (
        "tandem.serve.cli:serve",
        "Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, metrics).",
    ),
    "zoo": ("tandem.zoo.cli:zoo", "The bundled models: build them from the Python standard library."),
    "optimizers": (
        "tandem.optimize.cli:optimizers_command",
        "List every registered optimizer (built-in and plug-in) with its version and description.",
    ),
    "profile": (
        "tandem.optimize.cli:profile_command",
        "Measure a recipe's Profile (throughput by batch size, TTFT, memory, cold start).",
    ),
    "bench": (
        "tandem.optimize.cli:bench_command",
        "Run one trace-shaped workload through each recipe and through transformers; print ratios.",
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
                    rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tandem")
def cli() -> None:
    """tandem: an LLM inference platform (optimization layer + scheduling layer)."""


@cli.command()
@click.option("--model", "model_dir", type=click.Path(), default=None, help="HF model directory (default: bundled)")
@click.option("--prompt", required=True, help="Text to complete.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(0, 100), default=0.0, show_default=True, help="0 = greedy")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads (default: all cores)")
def generate(model_dir, prompt, max_tokens, temperature, top_p, top_k, seed, stop, dtype, threads) -> None:
    """Stream a completion of PROMPT to stdout."""
    from tandem.engine import Engine, EngineConfig, RequestError, SamplingParams
    from tandem.model import ModelLoadError, load_model

    try:
        model = load_model(model_dir, dtype=dtype)
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop
        )
        engine = Engine(model, EngineConfig(num_threads=threads, max_num_seqs=1))
        engine.add_request(prompt, params)
    except (ModelLoadError, RequestError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    out = sys.stdout
    out.write(prompt)
    while engine.has_unfinished():
        for step_out in engine.step():
            out.write(step_out.new_text)
            out.flush()
    out.write("\n")


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
