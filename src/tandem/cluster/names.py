"""Names that fit where they go: a readable prefix of the text, then a short hash of all of it.

A variant named after its recipe and a replica's log file named after the replica both come from
text an operator wrote, which may be any length: a recipe with a draft model's path runs past the
255 bytes a file name may have ("File name too long"). `bounded_name` keeps text that fits as it
is, and cuts the rest to a prefix that still says what it is plus 8 hex digits of its SHA-256, so
two long texts with the same start still get different names.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["HASH_CHARS", "bounded_name", "short_hash"]

HASH_CHARS = 8


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def bounded_name(name: str, max_chars: int, *, source: str | None = None) -> str:
    """`name` when it has at most `max_chars` characters, else its first characters, "-", and the short
    hash of `source` (default: `name`): `max_chars` characters in all."""
    if max_chars <= HASH_CHARS + 1:
        raise ValueError(f"a bounded name needs room for its hash: max_chars > {HASH_CHARS + 1}")
    if len(name) <= max_chars:
        return name
    prefix = re.sub(r"[-_.]+$", "", name[: max_chars - HASH_CHARS - 1])
    return f"{prefix}-{short_hash(name if source is None else source)}"
