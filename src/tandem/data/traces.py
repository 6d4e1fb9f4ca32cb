"""The one reader of request-trace CSVs (the Azure LLM inference trace's columns), for `tandem sim`,
`tandem bench` and `tandem gate` alike. Standard library only.

A trace has ContextTokens and GeneratedTokens per request, and (for the simulator, which replays
arrivals) TIMESTAMP: ISO 8601 as the Azure traces have it, or seconds. Every problem is a ValueError
naming the file, and the line or the column at fault.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

__all__ = ["LENGTH_COLUMNS", "TIMED_COLUMNS", "read_trace"]

LENGTH_COLUMNS = ("ContextTokens", "GeneratedTokens")
TIMED_COLUMNS = ("TIMESTAMP", *LENGTH_COLUMNS)


def _timestamp(text: str) -> float:
    try:
        return float(text)  # seconds, as some traces give them
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def read_trace(path: str | Path, timed: bool = True) -> list[tuple[float, int, int]]:
    """(timestamp in seconds, prompt tokens, output tokens) per row, in file order (timestamp 0.0
    when not `timed`, and the TIMESTAMP column is then not needed)."""
    path = Path(path)
    columns = TIMED_COLUMNS if timed else LENGTH_COLUMNS
    expected = f"a CSV trace with columns {','.join(columns)}"
    if not path.exists():
        raise ValueError(f"{path}: no such trace file (expected {expected})")
    if not path.is_file():
        raise ValueError(f"{path}: not a file (expected {expected})")
    rows: list[tuple[float, int, int]] = []
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                found = ",".join(reader.fieldnames or ()) or "nothing"
                raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (expected {expected}; found {found})")
            for line, row in enumerate(reader, start=2):
                try:
                    stamp = _timestamp(row["TIMESTAMP"]) if timed else 0.0
                    prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"{path}:{line}: bad row ({exc})") from None
                if prompt < 0 or output < 0:
                    raise ValueError(f"{path}:{line}: token counts must be >= 0")
                rows.append((stamp, prompt, output))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (expected {expected})") from None
    except csv.Error as exc:
        raise ValueError(f"{path}: not a readable CSV ({exc})") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None
    if not rows:
        raise ValueError(f"{path}: the trace has no requests")
    return rows
