"""Request bodies as JSON, checked once at the edge: valid UTF-8, valid JSON, bounded nesting, real Unicode.

`parse_json_body(raw)` returns the parsed value or raises an APIError(400) naming the problem (and
the field, for a string that holds a lone UTF-16 surrogate such as "\\ud800": JSON's escapes can
spell one, Python keeps it, and it can be neither tokenized nor written back out as UTF-8, so it
would otherwise surface as a 500 deep in a handler). Nesting deeper than MAX_JSON_DEPTH is refused
(Python's parser would raise RecursionError near 1,000 levels, and every later walk over the value
would risk the same); a cheap count of brackets skips that walk for ordinary bodies.

`parse_json_body_async` runs the same off the event loop for large bodies, so one big request
never stalls the others.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from tandem.edge.errors import APIError

__all__ = ["MAX_JSON_DEPTH", "OFF_LOOP_BYTES", "parse_json_body", "parse_json_body_async"]

MAX_JSON_DEPTH = 64  # OpenAI requests nest 4-6 levels (tools' JSON schemas a few more)
OFF_LOOP_BYTES = 64 * 1024  # larger bodies are parsed in a worker thread
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how a surrogate can enter valid UTF-8 JSON text


def _invalid(message: str, code: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _path(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the body)"


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _too_deep(where: str) -> APIError:
    return _invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels{where}", "json_too_deep")


def _check_depth(value: Any) -> None:
    """Level by level (no recursion), looking only at containers."""
    level, depth = [value], 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise _too_deep("")
        deeper: list[Any] = []
        for item in level:
            inner = item.values() if isinstance(item, dict) else item
            deeper.extend(v for v in inner if isinstance(v, dict | list))
        level = deeper


def _check_text(value: Any) -> None:
    """Every key and string is real Unicode (no lone surrogate); names the first field that is not."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                param = _path(where)
                raise _invalid(
                    f"{param}: contains a lone UTF-16 surrogate (such as \\ud800), which is not valid Unicode text",
                    "invalid_unicode",
                    param if where else None,
                )
        elif isinstance(item, dict):
            for key, inner in item.items():
                if _has_surrogate(key):
                    raise _invalid(f"{_path(where)}: a key contains a lone UTF-16 surrogate", "invalid_unicode")
                stack.append((inner, (*where, key)))
        elif isinstance(item, list):
            stack.extend((inner, (*where, i)) for i, inner in enumerate(item))


def parse_json_body(raw: bytes) -> Any:
    """The JSON value of a request body; APIError(400) for bad UTF-8, bad JSON, deep nesting or lone surrogates."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"the request body is not valid UTF-8 (byte {exc.start})", "invalid_json") from None
    try:
        value = json.loads(text)
    except RecursionError:  # ~1,000 levels: far past the limit
        raise _too_deep("") from None
    except ValueError as exc:  # JSONDecodeError, and integers beyond Python's digit limit
        raise _invalid(f"the request body is not valid JSON ({exc})", "invalid_json") from None
    # Fewer opening brackets than the limit cannot nest deeper than it: ordinary bodies skip the walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        _check_depth(value)
    if _SURROGATE_ESCAPE.search(raw) is not None:
        _check_text(value)
    return value


async def parse_json_body_async(raw: bytes) -> Any:
    """parse_json_body, in a worker thread when the body is large."""
    if len(raw) <= OFF_LOOP_BYTES:
        return parse_json_body(raw)
    return await asyncio.to_thread(parse_json_body, raw)
