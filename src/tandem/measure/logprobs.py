"""Per-token logprobs as OpenAI-compatible servers return them, read into one shape: a TokenTrack.

Two wire formats:
- legacy completions (and vLLM): `{"tokens": [...], "token_logprobs": [...], "top_logprobs":
  [{token: logprob}, ...], "text_offset": [...]}`; with `echo` the prompt's tokens come first and
  the first token's logprob and alternatives are null (nothing precedes it);
- chat completions: `{"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}]}`.

A position's top-1 is the likeliest entry of its alternatives (servers add the sampled token to
them, so it may not come first); None where a server sent none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["TokenTrack", "parse_logprobs"]


@dataclass(frozen=True)
class TokenTrack:
    tokens: tuple[str, ...]
    logprobs: tuple[float | None, ...]
    top1: tuple[str | None, ...]
    offsets: tuple[int, ...] | None = None  # character offset of each token in the response text

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.logprobs) != n or len(self.top1) != n or (self.offsets is not None and len(self.offsets) != n):
            raise ValueError("a TokenTrack's lists must have one entry per token")

    @classmethod
    def concat(cls, tracks: Iterable[TokenTrack]) -> TokenTrack:
        tracks = list(tracks)
        offsets = None
        if all(t.offsets is not None for t in tracks):
            offsets = tuple(o for t in tracks for o in t.offsets or ())
        return cls(
            tuple(x for t in tracks for x in t.tokens),
            tuple(x for t in tracks for x in t.logprobs),
            tuple(x for t in tracks for x in t.top1),
            offsets,
        )

    def span(self, start: int, stop: int | None = None) -> TokenTrack:
        """Positions start..stop-1 (offsets too, where the track has them)."""
        cut = slice(start, stop)
        offsets = None if self.offsets is None else self.offsets[cut]
        return TokenTrack(self.tokens[cut], self.logprobs[cut], self.top1[cut], offsets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": list(self.tokens),
            "logprobs": list(self.logprobs),
            "top1": list(self.top1),
            "offsets": None if self.offsets is None else list(self.offsets),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TokenTrack:
        offsets = raw.get("offsets")
        return cls(
            tuple(raw["tokens"]),
            tuple(raw["logprobs"]),
            tuple(raw["top1"]),
            None if offsets is None else tuple(offsets),
        )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def _best(alternatives: Any) -> str | None:
    """The likeliest token of a position's alternatives: a {token: logprob} dict or a chat list."""
    if isinstance(alternatives, dict):
        pairs = [(lp, tok) for tok, lp in alternatives.items() if _number(lp) is not None]
    elif isinstance(alternatives, list):
        pairs = [
            (item.get("logprob"), item.get("token"))
            for item in alternatives
            if isinstance(item, dict)
            and _number(item.get("logprob")) is not None
            and isinstance(item.get("token"), str)
        ]
    else:
        return None
    return max(pairs, key=lambda p: p[0])[1] if pairs else None


def parse_logprobs(raw: Any) -> TokenTrack | None:
    """A choice's `logprobs` field in either format; None when absent or not understood."""
    if not isinstance(raw, dict):
        return None
    if isinstance(raw.get("content"), list):  # chat
        content = [c for c in raw["content"] if isinstance(c, dict) and isinstance(c.get("token"), str)]
        return TokenTrack(
            tuple(c["token"] for c in content),
            tuple(_number(c.get("logprob")) for c in content),
            tuple(_best(c.get("top_logprobs")) for c in content),
        )
    tokens = raw.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        return None
    n = len(tokens)
    logprobs = raw.get("token_logprobs") or [None] * n
    top = raw.get("top_logprobs") or [None] * n
    offsets = raw.get("text_offset")
    if len(logprobs) != n or len(top) != n:
        return None
    if not (isinstance(offsets, list) and len(offsets) == n and all(isinstance(o, int) for o in offsets)):
        offsets = None
    return TokenTrack(
        tuple(tokens),
        tuple(_number(lp) for lp in logprobs),
        tuple(_best(t) for t in top),
        None if offsets is None else tuple(offsets),
    )
