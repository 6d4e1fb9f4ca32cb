"""The prefix block ids of a Mooncake JSON-lines trace (kvcache-ai/Mooncake FAST25-release): each
line's `hash_ids`, one id per 512-token block of the prompt, equal ids for an equal prefix (the id
of a block stands for it and every block before it). tandem.data.traces reads the rest of each line
(and checks it); this reads the ids, in file order, () for a line without them.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["MOONCAKE_BLOCK_TOKENS", "read_block_ids"]

MOONCAKE_BLOCK_TOKENS = 512  # tokens per block of Mooncake's hash_ids


def read_block_ids(path: str | Path) -> list[tuple[int, ...]]:
    """Each request's `hash_ids` (file order, blank lines skipped); a ValueError naming the line if bad."""
    path = Path(path)
    out: list[tuple[int, ...]] = []
    with path.open(encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            ids = json.loads(text).get("hash_ids", [])
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError(f"{path}:{line}: hash_ids must be a list of integers")
            out.append(tuple(ids))
    return out
