"""OpenAI-shaped completion bodies for tests of what reads them (tandem.measure, tandem.gate): SSE events."""

from __future__ import annotations

import json


def sse(*chunks: dict | str) -> bytes:
    """A server-sent-events body: each chunk a JSON event (or the literal [DONE])."""
    return b"".join(
        b"data: " + (c.encode() if isinstance(c, str) else json.dumps(c).encode()) + b"\n\n" for c in chunks
    )


def completion_chunk(text: str, tokens=None, logprobs=None, top=None, finish=None) -> dict:
    lp = None
    if tokens is not None:
        lp = {
            "tokens": tokens,
            "token_logprobs": logprobs or [-0.5] * len(tokens),
            "top_logprobs": top or [{t: -0.5} for t in tokens],
            "text_offset": list(range(len(tokens))),
        }
    return {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "logprobs": lp,
                                                                  "finish_reason": finish}]}  # fmt: skip


def usage_chunk(completion_tokens: int) -> dict:
    usage = {"prompt_tokens": 5, "completion_tokens": completion_tokens, "total_tokens": 5 + completion_tokens}
    return {"id": "c", "object": "text_completion", "choices": [], "usage": usage}
