"""The OpenAI response and stream-chunk bodies, as plain dicts built by pure functions.

Plain dicts (not pydantic models) because a streaming server builds one per token per client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tandem.engine import TokenLogprob

__all__ = [
    "usage",
    "completion_logprobs",
    "echo_logprobs",
    "chat_logprobs",
    "completion_choice",
    "chat_choice",
    "completion_body",
    "chat_body",
    "completion_chunk",
    "chat_chunk",
    "usage_chunk",
    "api_finish_reason",
]

TokenText = Callable[[int], str]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; with cached_tokens (prompt tokens the prefix cache served), its prompt_tokens_details."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def api_finish_reason(reason: str | None) -> str | None:
    # The engine says "abort" when a request was cut short (server shutdown deadline); OpenAI has no
    # such value, and a truncated answer is what "length" tells a client.
    return "length" if reason == "abort" else reason


def completion_logprobs(
    entries: Sequence[TokenLogprob | None],
    token_text: TokenText,
    text_offset: int = 0,
    token_ids: Sequence[int] | None = None,
) -> dict:
    """The legacy completions shape: parallel lists, offsets into the choice's text.

    With echo the entries start with the prompt's: the first prompt token has no logprob (None
    entry, as in OpenAI's API: null logprob and null top_logprobs); token_ids then name each token."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for i, entry in enumerate(entries):
        text = token_text(entry.token_id if entry is not None else token_ids[i])
        tokens.append(text)
        offsets.append(text_offset)
        text_offset += len(text)
        if entry is None:
            token_logprobs.append(None)
            top.append(None)
            continue
        token_logprobs.append(entry.logprob)
        alternatives: dict[str, float] = {}
        for t, lp in sorted(entry.top.items(), key=lambda kv: -kv[1]):
            alternatives.setdefault(token_text(t), lp)  # ids with the same text: keep the likelier
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def echo_logprobs(
    prompt_ids: Sequence[int],
    prompt_entries: Sequence[TokenLogprob | None] | None,
    entries: Sequence[TokenLogprob],
    token_text: TokenText,
    prompt_text: str,
) -> dict:
    """Logprobs of an echoed prompt followed by the completion's tokens; offsets into the returned text
    (`prompt_text` then the completion's). A prompt token whose text is not there (`<s>`: the
    tokenizer added it, the echoed prompt never had it) takes no room: its offset is where the text
    goes on, so every offset points into the choice's text."""
    prompt_entries = prompt_entries if prompt_entries is not None else [None] * len(prompt_ids)
    ids = [*prompt_ids, *(e.token_id for e in entries)]
    out = completion_logprobs([*prompt_entries, *entries], token_text, 0, ids)
    offsets, at = [], 0
    for text in out["tokens"][: len(prompt_ids)]:
        offsets.append(at)
        if text and prompt_text.startswith(text, at):
            at += len(text)
    at = len(prompt_text)
    for text in out["tokens"][len(prompt_ids) :]:
        offsets.append(at)
        at += len(text)
    out["text_offset"] = offsets
    return out


def _chat_token(token_id: int, logprob: float, token_text: TokenText) -> dict[str, Any]:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(entries: Sequence[TokenLogprob], token_text: TokenText) -> dict:
    content = []
    for entry in entries:
        item = _chat_token(entry.token_id, entry.logprob, token_text)
        ranked = sorted(entry.top.items(), key=lambda kv: -kv[1])
        item["top_logprobs"] = [_chat_token(t, lp, token_text) for t, lp in ranked]
        content.append(item)
    return {"content": content}


def completion_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict | None, stop_reason: str | int | None = None
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": api_finish_reason(finish_reason),
        "stop_reason": stop_reason,
    }


def chat_choice(
    index: int,
    text: str | None,
    finish_reason: str | None,
    logprobs: dict | None,
    stop_reason: str | int | None = None,
    tool_calls: list[dict] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:  # OpenAI's shape: content null (or the text beside the calls), finish_reason "tool_calls"
        message["tool_calls"] = tool_calls
        finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": api_finish_reason(finish_reason),
        "stop_reason": stop_reason,
    }


def _envelope(request_id: str, obj: str, created: int, model: str) -> dict[str, Any]:
    return {"id": request_id, "object": obj, "created": created, "model": model, "system_fingerprint": None}


def completion_body(request_id: str, created: int, model: str, choices: list[dict], use: dict) -> dict[str, Any]:
    return {**_envelope(request_id, "text_completion", created, model), "choices": choices, "usage": use}


def chat_body(request_id: str, created: int, model: str, choices: list[dict], use: dict) -> dict[str, Any]:
    return {**_envelope(request_id, "chat.completion", created, model), "choices": choices, "usage": use}


def completion_chunk(
    request_id: str,
    created: int,
    model: str,
    index: int,
    text: str,
    finish_reason: str | None,
    logprobs: dict | None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    choice = completion_choice(index, text, finish_reason, logprobs, stop_reason)
    return {**_envelope(request_id, "text_completion", created, model), "choices": [choice]}


def chat_chunk(
    request_id: str,
    created: int,
    model: str,
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None,
    logprobs: dict | None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": api_finish_reason(finish_reason),
        "stop_reason": stop_reason,
    }
    return {**_envelope(request_id, "chat.completion.chunk", created, model), "choices": [choice]}


def usage_chunk(request_id: str, obj: str, created: int, model: str, use: dict) -> dict[str, Any]:
    """The last chunk of a stream when stream_options.include_usage is set: no choices, just usage."""
    return {**_envelope(request_id, obj, created, model), "choices": [], "usage": use}
