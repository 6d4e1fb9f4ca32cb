"""A comma-separated choice of names on `tandem sim`'s command line (`--policies`, `--router`),
checked against the names known: one parser for every such flag."""

from __future__ import annotations

from collections.abc import Collection

import click

__all__ = ["names_from"]


def names_from(text: str, known: Collection[str], flag: str) -> list[str]:
    """The names in `text` ("a,b"), in order; a click error naming the unknown ones (or an empty list)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown {', '.join(unknown) or 'empty'} (known: {', '.join(known)})", param_hint=flag
        )
    return names
