"""Files the gate writes: clients' prompts and completions (gate-pairs.jsonl), its decisions, its
reports. They are created with mode 0600 (owner only), and a file found with wider permissions (one
an older version created 0644) is narrowed before anything more is written to it, so what clients
sent never lands in a world-readable file whatever the process's umask."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

__all__ = ["PRIVATE_MODE", "open_private", "write_private"]

PRIVATE_MODE = 0o600


def _open(path: Path, flags: int) -> int:
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)  # the mode above applies only when the file is new (and under the umask)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str | Path, *, buffering: int = -1) -> TextIO:
    """`path` opened for appending text, owner-only."""
    return os.fdopen(_open(Path(path), os.O_WRONLY | os.O_APPEND), "a", buffering=buffering, encoding="utf-8")


def write_private(path: str | Path, text: str) -> None:
    """`path` replaced by `text`, owner-only."""
    with os.fdopen(_open(Path(path), os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as out:
        out.write(text)
