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
        "List every registered optimizer (built-in and plug-in): version, description, parameters.",
    ),
    "profile": (
        "tandem.optimize.cli:profile_command",
        "Measure a recipe's Profile (throughput by batch size, TTFT, memory, cold start).",
    ),
    "gate": (
        "tandem.gate.cli:gate_command",
        "Run INCUMBENT and CANDIDATE side by side on the trace-shaped workload and judge latency, accuracy"
        " and unit cost.",
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
@click.argument("prompt_arg", metavar="[PROMPT]", required=False)
@click.option("--prompt", default=None, help="Text to complete (or give it as PROMPT, or on stdin).")
@click.option("--model", "model_dir", default=None, help="HF model directory or id org/name (default: bundled)")
@click.option("--recipe", default="baseline", show_default=True, help="Optimizer recipe, e.g. int8+ngram.")
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

    check_recipe(recipe)
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


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
