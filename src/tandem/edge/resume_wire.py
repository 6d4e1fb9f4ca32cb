"""The wire between the gateway and a tandem replica for resumable streams (both sides import it).

- A request with the header `x-tandem-token-ids: 1` (the gateway sets it) gets, before the events
  of each engine output, an SSE comment naming the output's new token ids:
  `: tandem-ids {"index":0,"ids":[12,13]}`. SSE clients ignore comments, and the gateway strips
  them before relaying, so a plain client never sees one.
- A request body with `tandem_continue: {"token_ids": [...], "text_sent": N}` continues an answer
  another replica began: the prompt (or the chat's rendered messages) is followed by `token_ids`,
  which count as output already generated (`max_tokens`, `min_tokens`, stop strings and `usage`
  count them), and of their text the client already has the first `text_sent` characters (the rest
  was held back, for a stop string or a split multi-byte character, and comes first).
"""

from __future__ import annotations

import json

__all__ = ["CONTINUE_FIELD", "TOKEN_IDS_HEADER", "ids_comment", "parse_ids_comment"]

TOKEN_IDS_HEADER = "x-tandem-token-ids"
CONTINUE_FIELD = "tandem_continue"
_PREFIX = b": tandem-ids "


def ids_comment(index: int, ids: list[int]) -> bytes:
    """The comment block naming one choice's new token ids."""
    return _PREFIX + json.dumps({"index": index, "ids": ids}, separators=(",", ":")).encode() + b"\n\n"


def parse_ids_comment(line: bytes) -> tuple[int, list[int]] | None:
    """(choice index, token ids) of a `: tandem-ids` comment line; None for any other line."""
    if not line.startswith(_PREFIX):
        return None
    try:
        value = json.loads(line[len(_PREFIX) :])
        ids = value["ids"]
        if isinstance(value["index"], int) and isinstance(ids, list) and all(type(t) is int for t in ids):
            return value["index"], ids
    except (ValueError, KeyError, TypeError):
        pass
    return None
