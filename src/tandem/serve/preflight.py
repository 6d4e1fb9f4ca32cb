"""Cheap checks before a replica's server starts, so a typo is a one-line error, not a failed load later."""

from __future__ import annotations

import click

from tandem.edge.settings import Settings

__all__ = ["preflight"]


def preflight(config: Settings) -> None:
    """The recipe's optimizers are built (not applied): a bad parameter (`speculative(q=3)`) fails here,
    in seconds, rather than after the model loaded; the model is found (or fetched) first, too.
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
