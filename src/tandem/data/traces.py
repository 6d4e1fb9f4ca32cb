"""The one reader of request traces, for `tandem sim`, `tandem bench` and `tandem gate` alike. Standard
library only. Two formats, told apart by the file's suffix:

- CSV (the Azure LLM inference trace's columns): ContextTokens and GeneratedTokens per request, and
  (for the simulator, which replays arrivals) TIMESTAMP: ISO 8601 as the Azure traces have it, or seconds.
- JSON lines (`.jsonl`, Mooncake's trace format, kvcache-ai/Mooncake FAST25-release): one object a line
  with `timestamp` (milliseconds from the start), `input_length` and `output_length` (tokens); other
  keys (`hash_ids`, the prompt's 512-token block ids) are ignored here.

Every problem is a ValueError naming the file, and the line or the column at fault.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

__all__ = ["JSONL_KEYS", "LENGTH_COLUMNS", "TIMED_COLUMNS", "read_trace"]

LENGTH_COLUMNS = ("ContextTokens", "GeneratedTokens")
TIMED_COLUMNS = ("TIMESTAMP", *LENGTH_COLUMNS)
JSONL_KEYS = ("timestamp", "input_length", "output_length")  # Mooncake: ms, tokens, tokens


def _timestamp(text: str) -> float:
    try:
        return float(text)  # seconds, as some traces give them
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def read_trace(path: str | Path, timed: bool = True) -> list[tuple[float, int, int]]:
    """(timestamp in seconds, prompt tokens, output tokens) per row, in file order (timestamp 0.0
    when not `timed`, and the TIMESTAMP column is then not needed)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return _read_jsonl(path, timed)
    columns = TIMED_COLUMNS if timed else LENGTH_COLUMNS
    expected = f"a CSV trace with columns {','.join(columns)}"
    if not path.exists():
        raise ValueError(f"{path}: no such trace file (expected {expected})")
    if not path.is_file():
        raise ValueError(f"{path}: not a file (expected {expected})")
    rows: list[tuple[float, int, int]] = []
    with _readable(path, expected), path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            found = ",".join(reader.fieldnames or ()) or "nothing"
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (expected {expected}; found {found})")
        for line, row in enumerate(reader, start=2):
            rows.append(_row(path, line, _csv_fields, row, timed))
    return _requests(path, rows)


def _read_jsonl(path: Path, timed: bool) -> list[tuple[float, int, int]]:
    """Mooncake's format: `timestamp` in ms (seconds here), `input_length`, `output_length`."""
    keys = JSONL_KEYS if timed else JSONL_KEYS[1:]
    expected = f"a JSON-lines trace with keys {', '.join(keys)}"
    if not path.is_file():
        raise ValueError(f"{path}: no such trace file (expected {expected})")
    rows: list[tuple[float, int, int]] = []
    with _readable(path, expected), path.open(encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line}: not a JSON object ({exc.msg})") from None
            if not isinstance(row, dict) or any(k not in row for k in keys):
                raise ValueError(f"{path}:{line}: missing key(s) (expected {expected})")
            rows.append(_row(path, line, _jsonl_fields, row, timed))
    return _requests(path, rows)


def _csv_fields(row: dict, timed: bool) -> tuple[float, int, int]:
    return _timestamp(row["TIMESTAMP"]) if timed else 0.0, int(row["ContextTokens"]), int(row["GeneratedTokens"])


def _jsonl_fields(row: dict, timed: bool) -> tuple[float, int, int]:
    return float(row["timestamp"]) / 1000.0 if timed else 0.0, int(row["input_length"]), int(row["output_length"])


def _row(
    path: Path, line: int, fields: Callable[[dict, bool], tuple[float, int, int]], row: dict, timed: bool
) -> tuple[float, int, int]:
    """One request read from line `line`: a ValueError naming the line when its fields are bad."""
    try:
        stamp, prompt, output = fields(row, timed)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}:{line}: bad row ({exc})") from None
    if prompt < 0 or output < 0:
        raise ValueError(f"{path}:{line}: token counts must be >= 0")
    return stamp, prompt, output


@contextmanager
def _readable(path: Path, expected: str) -> Iterator[None]:
    """A file that cannot be read as text of its format: a ValueError naming the file and the format."""
    try:
        yield
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (expected {expected})") from None
    except csv.Error as exc:
        raise ValueError(f"{path}: not a readable CSV ({exc})") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the trace ({exc.strerror or exc})") from None


def _requests(path: Path, rows: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    if not rows:
        raise ValueError(f"{path}: the trace has no requests")
    return rows
