"""What one variant answered to one request, and how fast: an Observation, recorded from the HTTP response.

The same recorder serves both sides of a pair: the gateway feeds it the incumbent's bytes as it
relays them to the client, the shadow mirror feeds it the candidate's. Streams (server-sent
events) give TTFT and time per output token; a non-streamed answer gives only its end-to-end time.

- TTFT: from sending the request to the first event carrying output text.
- TPOT: (last output event - first output event) / (output tokens - 1), as vLLM's benchmark
  counts it; a server that streams several tokens per event (speculative decoding) is measured
  by its token count (usage, else logprobs, else events), not by its events.
- Errors: an HTTP status >= 400 (the OpenAI error body's message), an error event inside a
  stream, a stream cut before `data: [DONE]`, or a transport failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from tandem.measure.logprobs import TokenTrack, parse_logprobs

__all__ = ["Observation", "ResponseRecorder", "observe"]


@dataclass(frozen=True)
class Observation:
    status: int  # HTTP status; 0 when no response came (connect error, timeout)
    error: str | None  # None: the request succeeded
    e2e_s: float | None
    ttft_s: float | None = None  # streamed answers only
    tpot_s: float | None = None  # streamed answers with >= 2 output tokens
    completion_tokens: int | None = None
    text: str = ""
    finish_reason: str | None = None
    tokens: TokenTrack | None = None  # per-token logprobs, when the request asked for them

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("status", "error", "e2e_s", "ttft_s", "tpot_s", "completion_tokens")}
        out.update(text=self.text, finish_reason=self.finish_reason)
        out["tokens"] = self.tokens.to_dict() if self.tokens is not None else None
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Observation:
        values = dict(raw)
        if values.get("tokens") is not None:
            values["tokens"] = TokenTrack.from_dict(values["tokens"])
        return cls(**values)


def _error_message(body: bytes, status: int) -> str:
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if message:
            return f"HTTP {status}: {message}"
    except (ValueError, AttributeError):
        pass
    return f"HTTP {status}"


def _choice_text(choice: Mapping[str, Any]) -> str:
    if "text" in choice:  # completions
        return choice.get("text") or ""
    holder = choice.get("delta") or choice.get("message") or {}  # chat: a stream's delta, a body's message
    return (holder.get("content") or "") if isinstance(holder, dict) else ""


class ResponseRecorder:
    """Feed it the status and the body's bytes as they arrive (each with the time); `finish` says what came."""

    def __init__(self, started_at: float, stream: bool) -> None:
        self.started_at = started_at
        self.stream = stream
        self.status_code = 0
        self._buffer = b""
        self._body = bytearray()
        self._text: list[str] = []
        self._tracks: list[TokenTrack] = []
        self._first_at: float | None = None
        self._last_at: float | None = None
        self._events = 0  # events that carried output text
        self._usage_tokens: int | None = None
        self._finish_reason: str | None = None
        self._done = False
        self._error: str | None = None

    def status(self, code: int) -> None:
        self.status_code = code

    def feed(self, data: bytes, at: float) -> None:
        if not self.stream or self.status_code >= 400:
            self._body += data
            return
        self._buffer += data.replace(b"\r\n", b"\n")
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip(), at)

    def _event(self, data: bytes, at: float) -> None:
        if data == b"[DONE]":
            self._done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            self._error = self._error or "the stream carried an event that is not JSON"
            return
        if not isinstance(chunk, dict):
            return
        if chunk.get("error") is not None:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            self._error = self._error or f"error event in the stream: {message}"
            return
        if isinstance(chunk.get("usage"), dict) and chunk["usage"].get("completion_tokens") is not None:
            self._usage_tokens = int(chunk["usage"]["completion_tokens"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # the gate pairs the first choice only
            text = _choice_text(choice)
            track = parse_logprobs(choice.get("logprobs"))
            if track is not None:
                self._tracks.append(track)
            if text or (track is not None and track.tokens):
                self._text.append(text)
                self._events += 1
                self._first_at = at if self._first_at is None else self._first_at
                self._last_at = at
            self._finish_reason = choice.get("finish_reason") or self._finish_reason

    def finish(self, at: float, error: str | None = None) -> Observation:
        e2e = at - self.started_at
        if error is not None or self.status_code == 0:
            return Observation(self.status_code, error or "no response", e2e)
        if self.status_code >= 400:
            return Observation(self.status_code, _error_message(bytes(self._body), self.status_code), e2e)
        if not self.stream:
            return self._finish_body(e2e)
        if self._error is None and not self._done:
            self._error = "the stream ended before data: [DONE]"
        tokens = TokenTrack.concat(self._tracks) if self._tracks else None
        count = self._usage_tokens
        if count is None:
            count = len(tokens.tokens) if tokens is not None else self._events
        ttft = tpot = None
        if self._first_at is not None:
            ttft = self._first_at - self.started_at
            if count >= 2 and self._last_at is not None:
                tpot = (self._last_at - self._first_at) / (count - 1)
        return Observation(
            self.status_code, self._error, e2e, ttft, tpot, count, "".join(self._text), self._finish_reason, tokens
        )

    def _finish_body(self, e2e: float) -> Observation:
        try:
            body = json.loads(bytes(self._body))
            choice = next(c for c in body["choices"] if c.get("index", 0) == 0)
        except (ValueError, KeyError, TypeError, StopIteration):
            return Observation(self.status_code, "the response body is not an OpenAI completion", e2e)
        tokens = parse_logprobs(choice.get("logprobs"))
        usage = body.get("usage") or {}
        count = usage.get("completion_tokens")
        if count is None and tokens is not None:
            count = len(tokens.tokens)
        return Observation(
            self.status_code, None, e2e, None, None, count, _choice_text(choice), choice.get("finish_reason"), tokens
        )


async def observe(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    *,
    headers: Mapping[str, str] | None = None,
    clock: Callable[[], float],
    stream: bool,
) -> Observation:
    """POST `body` to `url` and record the answer. Cancelling the caller cancels the request."""
    recorder = ResponseRecorder(clock(), stream)
    try:
        async with client.stream("POST", url, content=body, headers=dict(headers or {})) as response:
            recorder.status(response.status_code)
            async for data in response.aiter_bytes():
                recorder.feed(data, clock())
    except httpx.HTTPError as exc:
        return recorder.finish(clock(), error=f"{type(exc).__name__}: {exc}".rstrip(": "))
    return recorder.finish(clock())
