"""Resuming a stream that broke mid-way: what was relayed, and what to ask next. Pure (bytes and dicts in and out).

The gateway keeps a `StreamLedger` of every stream it relays: the events, cut at their blank lines
(a partial event is never relayed, so a break never leaves half an event at the client), the text
relayed of the answer, the generated token ids where a tandem replica names them
(tandem.edge.resume_wire, comments stripped here: a client never sees one), whether the answer
finished, and an error event from the replica (held back: the stream may still be resumed).

When the stream breaks, `continuation` says what to send to the next replica, or why nothing can be:
- a tandem replica, token ids known: the original body plus `tandem_continue` (the ids, and the
  characters of their text the client has): token for token an uninterrupted run's answer, its
  usage counting the whole answer (tandem.serve.continuation);
- otherwise (an external engine, or ids unknown) the text so far: completions as `prompt + text`
  with `max_tokens` reduced by the tokens relayed (one per event, as engines stream); chat as
  the messages plus the partial assistant message with `continue_final_message: true,
  add_generation_prompt: false` on engines that take it (vLLM's and SGLang's, by their metrics
  adapter); a continuation's usage is counted back to the whole answer (roughly, for text);
- not resumable (stays today's error event, counted): n > 1, tools, structured output, echo, a
  prompt of token ids or several prompts on an external engine, a chat on an engine without
  `continue_final_message`.
The continuation's events are relayed into the same client stream with the first stream's id and
creation time, without a second role chunk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tandem.edge.resume_wire import CONTINUE_FIELD, parse_ids_comment
from tandem.schedule.fallback import FailureKind

__all__ = ["CONTINUE_FINAL_MESSAGE_ENGINES", "StreamLedger", "continuation", "error_kind"]

# Engines (by metrics adapter) whose chat API continues a final assistant message (continue_final_message).
CONTINUE_FINAL_MESSAGE_ENGINES = frozenset({"vllm", "sglang"})
_STRUCTURED = (
    "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
)  # fmt: skip
_DONE = b"data: [DONE]"


def error_kind(error: dict[str, Any]) -> FailureKind:
    """What an error event from a replica says of it: shutting down (draining) is the replica's, else its variant's."""
    code = (error.get("error") or {}).get("code") if isinstance(error.get("error"), dict) else None
    return FailureKind.UNAVAILABLE if code in ("shutting_down", "overloaded") else FailureKind.SERVER_ERROR


@dataclass
class StreamLedger:
    """One stream as relayed (choice 0: streams with n > 1 are not resumed). `feed` the replica's bytes,
    relay what it returns."""

    chat: bool
    ids: list[int] | None = None  # None: the replica named none (an external engine)
    text: str = ""  # the answer's text relayed
    events: int = 0  # events with text relayed (about one token each on an external engine)
    finished: bool = False  # a finish_reason was relayed
    done: bool = False  # data: [DONE] was relayed
    error: dict[str, Any] | None = None  # the replica's error event (held back)
    resumed: int = 0  # continuations relayed so far
    usage_shift: int = 0  # tokens to move from prompt to completion in a text continuation's usage
    _head: dict[str, Any] = field(default_factory=dict)  # the first stream's id, created, model
    _buffer: bytes = b""

    @property
    def broken(self) -> bool:
        return self.error is not None

    def feed(self, chunk: bytes) -> bytes:
        """The complete events in `chunk` (with what was buffered) to relay; the rest stays buffered."""
        if self.broken or self.done:
            return b""
        self._buffer += chunk
        *blocks, self._buffer = self._buffer.split(b"\n\n")
        out = []
        for block in blocks:
            relayed = self._event(block)
            if relayed is not None:
                out.append(relayed + b"\n\n")
            if self.broken or self.done:
                self._buffer = b""
                break
        return b"".join(out)

    def restart(self, text_continuation: bool) -> None:
        """A continuation starts: what it relays joins this stream."""
        self._buffer, self.error = b"", None
        self.resumed += 1
        if text_continuation:
            self.usage_shift = self.events

    def _event(self, block: bytes) -> bytes | None:
        lines = block.split(b"\n")
        data = [line for line in lines if line.startswith(b"data:")]
        for line in lines:
            parsed = parse_ids_comment(line)
            if parsed is not None and parsed[0] == 0:
                self.ids = (self.ids or []) + parsed[1]
        if not data:
            kept = [line for line in lines if not line.startswith(b":") and line.strip()]
            return b"\n".join(kept) if kept else None  # comments (ids, keep-alives) stay here
        payload = b"\n".join(line[5:].lstrip(b" ") for line in data)
        if payload.strip() == b"[DONE]":
            self.done = True
            return _DONE
        try:
            event = json.loads(payload)
        except ValueError:
            return block  # not ours to judge
        if not isinstance(event, dict):
            return block
        if "error" in event and not event.get("choices"):
            self.error = event
            return None
        return self._relay(event, block)

    def _relay(self, event: dict[str, Any], block: bytes) -> bytes | None:
        choices = event.get("choices") or []
        first = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
        piece = ""
        if first is not None:
            delta = first.get("delta") if self.chat else None
            piece = ((delta or {}).get("content") if self.chat else first.get("text")) or ""
            delta = delta or {}
            if self.resumed and self.chat and delta.get("role") and not (piece or first.get("finish_reason")):
                if not delta.get("tool_calls") and not first.get("logprobs"):
                    return None  # the continuation's own role chunk: the client has one
            self.text += piece
            self.events += 1 if piece else 0
            self.finished = self.finished or bool(first.get("finish_reason"))
        if not self._head:
            self._head = {k: event[k] for k in ("id", "created") if k in event}
            return block
        if not self.resumed:
            return block
        event = {**event, **self._head}
        usage = event.get("usage")
        if self.usage_shift and isinstance(usage, dict):
            shift = min(self.usage_shift, int(usage.get("prompt_tokens") or 0))
            usage = {**usage, "prompt_tokens": int(usage.get("prompt_tokens") or 0) - shift}
            usage["completion_tokens"] = int(usage.get("completion_tokens") or 0) + self.usage_shift
            event["usage"] = usage
        return b"data: " + json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def continuation(
    payload: Any, ledger: StreamLedger, tandem_target: bool, engine_adapter: str | None = None
) -> tuple[dict[str, Any] | None, str]:
    """(the body that continues the stream on the next replica, "") or (None, why it cannot be).
    `tandem_target`: the next replica is tandem's own; else `engine_adapter` names the external engine's kind."""
    if not isinstance(payload, dict):
        return None, "the request is not JSON"
    if int(payload.get("n") or 1) != 1:
        return None, "n > 1"
    if payload.get("tools") and payload.get("tool_choice") != "none":
        return None, "tools"
    if any(payload.get(name) is not None for name in _STRUCTURED):
        return None, "structured output"
    if payload.get("echo"):
        return None, "echo"
    if tandem_target and ledger.ids is not None:
        if not ledger.ids:  # nothing generated yet: the same request again (a continuation needs ids)
            return dict(payload), ""
        cont = {"token_ids": ledger.ids, "text_sent": len(ledger.text)}
        return {**payload, CONTINUE_FIELD: cont}, ""
    return _text_continuation(payload, ledger, tandem_target, engine_adapter)


def _text_continuation(
    payload: dict[str, Any], ledger: StreamLedger, tandem_target: bool, engine_adapter: str | None
) -> tuple[dict[str, Any] | None, str]:
    body = dict(payload)
    if ledger.chat:
        if tandem_target or engine_adapter not in CONTINUE_FINAL_MESSAGE_ENGINES:
            return None, "a chat on an engine without continue_final_message"
        if ledger.text:
            body["messages"] = [*payload.get("messages", []), {"role": "assistant", "content": ledger.text}]
            body["continue_final_message"], body["add_generation_prompt"] = True, False
        name = "max_completion_tokens" if payload.get("max_completion_tokens") is not None else "max_tokens"
    else:
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return None, "a prompt of token ids, or several prompts"
        body["prompt"] = prompt + ledger.text
        name = "max_tokens"
        if payload.get(name) is None:
            body[name] = 16  # the completions API's default: what the first stream had
    if body.get(name) is not None:
        left = int(body[name]) - ledger.events
        if left < 1:
            return None, "max_tokens were all generated"
        body[name] = left
    if payload.get("min_tokens"):
        body["min_tokens"] = max(0, int(payload["min_tokens"]) - ledger.events)
    return body, ""
