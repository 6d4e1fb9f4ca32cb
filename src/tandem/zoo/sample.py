"""A small fixed sample of held-out code, committed beside the models for tests and benchmarks.

Tests must not depend on the interpreter's stdlib being byte-identical to the build machine's, so
the sample's text is stored, not re-read. It is the first lines of each held-out file (never a
training file), cut at a line boundary, until the sample reaches its byte budget.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tandem.zoo.corpus import SourceFile

__all__ = ["SAMPLE_FILE_NAME", "heldout_sample", "save_sample", "load_sample"]

SAMPLE_FILE_NAME = "tandem-code-heldout-sample.json"
LICENSE_NOTE = (
    "Excerpts of the Python standard library, Copyright (c) 2001-2023 Python Software Foundation; "
    "All Rights Reserved. Distributed under the PSF License Agreement (Python's LICENSE file)."
)


def _head(text: str, max_bytes: int) -> str:
    """The longest run of whole lines from the start of `text` within `max_bytes` UTF-8 bytes."""
    out, size = [], 0
    for line in text.splitlines(keepends=True):
        size += len(line.encode())
        if size > max_bytes:
            break
        out.append(line)
    return "".join(out)


def heldout_sample(
    heldout: Sequence[SourceFile], total_bytes: int = 48_000, per_file_bytes: int = 6_000
) -> list[SourceFile]:
    sample, size = [], 0
    for source in heldout:
        head = _head(source.text, min(per_file_bytes, total_bytes - size))
        if head.strip():
            sample.append(SourceFile(source.path, head))
            size += len(head.encode())
        if size >= total_bytes - 200:
            break
    return sample


def save_sample(sample: Sequence[SourceFile], path: Path, heldout_list_sha256: str) -> None:
    payload = {
        "description": "Held-out evaluation sample of the tandem-code models: the first lines of "
        "held-out Python standard library files (none of them in the training split).",
        "source": f"CPython {sys.version.split()[0]} Lib/",
        "license": LICENSE_NOTE,
        "heldout_list_sha256": heldout_list_sha256,
        "files": [{"path": f.path, "text": f.text} for f in sample],
    }
    Path(path).write_text(json.dumps(payload, indent=1) + "\n")


def load_sample(path: Path) -> list[SourceFile]:
    payload = json.loads(Path(path).read_text())
    return [SourceFile(f["path"], f["text"]) for f in payload["files"]]
