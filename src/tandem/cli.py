"""The `tandem` command. Bad input ends with a one-line message and a non-zero exit, never a traceback."""

from __future__ import annotations

import sys

import click

__all__ = ["main", "cli"]


class _LazyGroup(click.Group):
    """Commands that live in a package importing torch are imported when run, never to list them:
    `tandem --help` and the scheduling layer's commands (`tandem sim`) load no torch."""

    # name -> (module, attribute, one-line help shown by `tandem --help`)
    lazy: dict[str, tuple[str, str, str]] = {
        "optimizers": ("tandem.optimize.cli", "optimizers_command", "List every registered optimizer."),
        "profile": ("tandem.optimize.cli", "profile_command",
                    "Measure a recipe's Profile, or import one from the splitwise GPU timings."),
        "bench": ("tandem.optimize.cli", "bench_command", "Run one workload through recipes and transformers."),
    }  # fmt: skip

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            import importlib

            module, attribute, _ = self.lazy[name]
            self.add_command(getattr(importlib.import_module(module), attribute), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, self.lazy[name][2] if name in self.lazy and name not in self.commands
             else self.commands[name].get_short_help_str(formatter.width - 6))
            for name in self.list_commands(ctx)
        ]  # fmt: skip
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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


def _register_optional_groups() -> None:
    # Sub-commands live beside the code they drive; each registers itself here.
    import importlib

    for module, name in (
        ("tandem.zoo.cli", "zoo"),
        ("tandem.serve.cli", "serve"),
        ("tandem.sim.cli", "sim_command"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                raise
            continue
        for command in [getattr(mod, name)] if name else getattr(mod, "COMMANDS", []):
            cli.add_command(command)


_register_optional_groups()


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
