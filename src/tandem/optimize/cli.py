"""`tandem optimizers` and `tandem bench`, the optimization layer's commands, and the recipe side of
`tandem profile` (the command itself is tandem.cli's: it also imports and measures black-box)."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["BadRecipe", "bench_command", "check_recipe", "optimizers_command", "profile_recipe"]


class BadRecipe(click.ClickException):
    """An unknown optimizer or parameter: one line and exit 2 (a usage error), before anything loads."""

    exit_code = 2


def check_recipe(recipe: str) -> str:
    """`recipe` if every step names a registered optimizer with valid parameters, else BadRecipe."""
    from tandem.optimize import RecipeError, validate_recipe

    try:
        validate_recipe(recipe)
    except RecipeError as exc:
        raise BadRecipe(str(exc)) from None
    return recipe


@click.command("optimizers")
def optimizers_command() -> None:
    """List every registered optimizer (built-in and plug-in): version, description, parameters."""
    from rich.console import Console
    from rich.table import Table

    from tandem.optimize import describe

    table = Table(title="tandem optimizers (compose with '+': int8+speculative(k=4))")
    for column in ("name", "version", "description", "parameters (name: type = default)"):
        table.add_column(column)
    for name, version, description, params in describe():
        table.add_row(name, version, description, params.replace(", ", "\n") or "-")
    Console().print(table)


def profile_recipe(model_dir: str | None, recipe: str | None, batch_sizes: str, threads: int | None, quiet: bool):
    """`tandem profile --recipe R`: measure the recipe's Profile on this machine (a progress bar on a terminal)."""
    from tandem.model import ModelLoadError
    from tandem.optimize import RecipeError, defaults
    from tandem.optimize.profile import measure_profile
    from tandem.progress import StepProgress

    try:
        sizes = tuple(sorted({int(b) for b in batch_sizes.split(",")}))
        if not sizes or min(sizes) < 1:
            raise ValueError
    except ValueError:
        raise click.BadParameter("a comma-separated list of positive integers", param_hint="--batch-sizes") from None
    recipe = check_recipe(recipe or defaults.DEFAULT_RECIPE)
    try:
        with StepProgress(f"profile {recipe}", quiet=quiet) as bar:
            return measure_profile(model_dir, recipe, batch_sizes=sizes, threads=threads, progress=bar.step)
    except (ModelLoadError, RecipeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def _hf_rows(asked: bool | None, console) -> bool:
    """Whether to run transformers' rows: as asked, else when transformers is installed (it is optional)."""
    import importlib.util

    if importlib.util.find_spec("transformers") is not None:
        return asked is not False
    if asked:
        raise click.ClickException("--hf needs transformers (pip install transformers), which is not installed")
    if asked is None:
        console.print("note: transformers is not installed, so the hf-* rows are skipped (pip install transformers)")
    return False


@click.command("bench")
@click.option("--model", "model_dir", type=click.Path(), default=None, help="HF model directory (default: bundled)")
@click.option("--recipes", default="baseline,int8,ngram,speculative", show_default=True, help="comma-separated")
@click.option("--requests", "num_requests", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--usd-per-hour",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="machine price for the cost column (default: a pinned c7a.large price)",
)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=32, show_default=True)
@click.option(
    "--hf/--no-hf",
    "hf_rows",
    default=None,
    help="include transformers rows (default: when transformers is installed; --hf requires it)",
)
@click.option("--hf-batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="timed rounds, every row once per round (one process per row); each row's fastest run is reported",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="write a PNG of throughput and latency per row (needs matplotlib: tandem[plots])",
)
@click.option(
    "--trace",
    type=click.Path(),
    default=None,
    help="CSV of request lengths (columns ContextTokens,GeneratedTokens; default: the bundled Azure trace)",
)
@click.option("-q", "--quiet", is_flag=True, help="no progress bar (there is none when stderr is not a terminal)")
def bench_command(
    model_dir, recipes, num_requests, usd_per_hour, max_num_seqs, hf_rows, hf_batch_size, seed, repeats, json_path,
    plot_path, trace, quiet,
):  # fmt: skip
    """Run one trace-shaped workload through each recipe and through transformers; print ratios."""
    import json
    import sys

    from rich.console import Console
    from rich.table import Table

    from tandem.model import ModelLoadError
    from tandem.optimize import RecipeError
    from tandem.optimize.bench import DEFAULT_PRICE, rows_as_json, run_bench
    from tandem.optimize.bench_workers import BenchWorkerError
    from tandem.progress import StepProgress

    console = Console(stderr=True)
    if plot_path:
        from tandem.plotting import PlotUnavailable, pyplot

        try:
            pyplot()  # before the bench runs, not after
        except PlotUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    hf_rows = _hf_rows(hf_rows, console)
    price, source = (usd_per_hour, "given with --usd-per-hour") if usd_per_hour else DEFAULT_PRICE
    recipe_list = [r.strip() for r in recipes.split(",") if r.strip()]
    try:
        for recipe in recipe_list:
            check_recipe(recipe)
        if "baseline" not in recipe_list:
            recipe_list.insert(0, "baseline")  # every ratio is to baseline, measured in the same run
        with StepProgress("bench", console, quiet) as bar:
            rows = run_bench(
                model_dir,
                recipe_list,
                num_requests,
                price,
                max_num_seqs,
                hf_rows,
                hf_batch_size,
                seed,
                progress=bar.step,
                repeats=repeats,
                trace=trace,
            )
    except (ModelLoadError, RecipeError, ValueError, FileNotFoundError, BenchWorkerError) as exc:
        raise click.ClickException(str(exc)) from None
    results = rows_as_json(rows)
    title = f"tandem bench: {num_requests} requests, ${price}/h ({source})"
    table = Table(title=title)
    for column in (
        "recipe",
        "out tok/s",
        "x base",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "$/M tok",
        "accept",
    ):
        table.add_column(column, justify="right")
    for r in results:
        accept = f"{r['acceptance_rate']:.0%} ({r['mean_acceptance_length']:.2f})" if r["acceptance_rate"] else ""
        table.add_row(
            r["recipe"],
            f"{r['output_tokens_per_s']:.1f}",
            f"{r['throughput_vs_baseline']:.2f}x",
            f"{r['ttft_p50_s']:.3f}s",
            f"{r['ttft_p99_s']:.3f}s",
            f"{1e3 * r['tpot_p50_s']:.1f}ms",
            f"{1e3 * r['tpot_p99_s']:.1f}ms",
            f"{r['usd_per_million_tokens']:.3f}",
            accept,
        )
    Console().print(table)
    if plot_path:
        from tandem.optimize.bench_plot import bench_png

        Path(plot_path).write_bytes(bench_png(results, title))
    if json_path:
        payload = {
            "command": " ".join(["tandem", *sys.argv[1:]]),
            "usd_per_hour": price,
            "price_source": source,
            "repeats": repeats,
            "results": results,
        }
        Path(json_path).write_text(json.dumps(payload, indent=2) + "\n")
