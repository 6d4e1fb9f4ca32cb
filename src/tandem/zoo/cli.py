"""`tandem zoo`: build the bundled default models (`tandem zoo build --out src/tandem/data/models/`)."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["zoo"]

PRESETS = ("bundled", "tiny")


@click.group()
def zoo() -> None:
    """The bundled models: build them from the Python standard library."""


def _command_line(params: dict, defaults: dict) -> str:
    """The canonical command that reproduces this build: non-default options only."""
    parts = ["tandem zoo build"]
    for name, value in params.items():
        if value != defaults.get(name) or name == "out":
            parts.append(f"--{name.replace('_', '-')} {value}")
    return " ".join(parts)


@zoo.command()
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="src/tandem/data/models/",
    show_default=True,
    help="Directory to write tandem-code-target/ and tandem-code-draft/ into.",
)
@click.option(
    "--corpus",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Directory of *.py files to train on (default: this interpreter's standard library).",
)
@click.option(
    "--preset",
    type=click.Choice(PRESETS),
    default="bundled",
    show_default=True,
    help="Model shapes: 'bundled' (the committed models) or 'tiny' (tests and dry runs).",
)
@click.option("--target-steps", type=click.IntRange(min=1), default=None, help="Default: the preset's.")
@click.option("--draft-steps", type=click.IntRange(min=1), default=None, help="Default: the preset's.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Default: the preset's.")
@click.option("--seq-len", type=click.IntRange(min=8), default=None, help="Default: the preset's.")
@click.option("--vocab-size", type=click.IntRange(min=300), default=None, help="Default: the preset's.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
def build(out, corpus, preset, target_steps, draft_steps, batch_size, seq_len, vocab_size, seed, threads) -> None:
    """Train the tokenizer, the target and the distilled draft; evaluate; write HF model directories."""
    from dataclasses import replace

    from tandem.zoo.build import build_models
    from tandem.zoo.presets import preset_config

    context = click.get_current_context()
    defaults = {p.name: p.default for p in context.command.params}
    config = preset_config(preset)
    overrides = {
        "target_steps": target_steps,
        "draft_steps": draft_steps,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "vocab_size": vocab_size,
    }
    config = replace(
        config,
        **{k: v for k, v in overrides.items() if v is not None},
        seed=seed,
        threads=threads,
        corpus_root=Path(corpus) if corpus else None,
    )
    try:
        build_models(Path(out), config, _command_line(context.params, defaults))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
