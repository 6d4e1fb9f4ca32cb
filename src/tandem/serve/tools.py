"""Tool calls: `tools` + `tool_choice` -> an output constraint and a parser; the text -> OpenAI tool_calls.

- tool_choice {"type": "function", "function": {"name": N}}: the output is constrained to N's
  arguments (its `parameters` schema) and returned as one call to N;
- "required": constrained to a JSON array of calls [{"name", "arguments"}] (one at most when
  parallel_tool_calls is false), each call's arguments to its function's schema;
- "auto": unconstrained; the model's own tool format is parsed out of the text by the server's
  --tool-call-parser (hermes: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks,
  Hermes, Qwen 2.5 and many others' format), text outside the blocks stays content;
- "none": no tool calls (the tools still reach the chat template, as vLLM does).
Omitted, tool_choice is "auto" when tools are given (OpenAI's default), and "auto" without a parser
is a 400 naming the flag. Pure functions, no I/O.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from tandem.edge.errors import APIError
from tandem.engine import GrammarSpec
from tandem.serve.structured import closed_objects

__all__ = [
    "TOOL_CALL_PARSERS",
    "ToolCallStream",
    "ToolPlan",
    "plan_tools",
    "parse_tool_calls",
    "tool_call",
    "hermes_text",
]

TOOL_CALL_PARSERS = ("hermes",)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # "named", "required" or "auto"
    function: str | None = None  # named: the function called
    parser: str | None = None  # auto: the parser of the model's tool format


def _bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


def _functions(tools: list[Any]) -> dict[str, dict]:
    """name -> parameters schema, with every tool checked."""
    out: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise _bad(param, "only tools of type 'function' are supported")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _bad(param, "function must be an object with a 'name'")
        name = function["name"]
        if not _NAME.match(name):
            raise _bad(param, f"function name {name!r} must be 1-64 letters, digits, '_' or '-'")
        if name in out:
            raise _bad(param, f"function {name!r} is defined twice")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise _bad(param, "function.parameters must be a JSON schema object")
        out[name] = closed_objects(parameters)
    return out


def _calls_schema(functions: dict[str, dict], parallel: bool) -> dict:
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, parameters in functions.items()
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
    }
    if not parallel:
        schema["maxItems"] = 1
    return schema


def plan_tools(
    tools: list[Any] | None, tool_choice: Any, parallel: bool, parser: str | None
) -> tuple[ToolPlan | None, tuple[str, GrammarSpec] | None]:
    """(how to read the output, the constraint and the field it is named by in errors)."""
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    if tool_choice == "none":
        return None, None
    if not tools:
        raise _bad("tool_choice", f"{json.dumps(tool_choice)} needs tools")
    functions = _functions(tools)
    if tool_choice == "auto":
        if parser is None:
            raise _bad(
                "tool_choice",
                '"auto" needs the server started with --tool-call-parser (hermes); send "required", '
                'a named function or "none"',
                code="unsupported_value",
            )
        return ToolPlan("auto", parser=parser), None
    if tool_choice == "required":
        spec = GrammarSpec("json", json.dumps(_calls_schema(functions, parallel)))
        return ToolPlan("required"), ("tools", spec)
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        if name not in functions:
            known = ", ".join(sorted(functions))
            raise _bad("tool_choice", f"function {name!r} is not among the tools ({known})")
        return ToolPlan("named", function=name), ("tools", GrammarSpec("json", json.dumps(functions[name])))
    raise _bad("tool_choice", 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}')


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _as_call(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    return tool_call(item["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


def parse_tool_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of a finished output; a text that does not parse stays content."""
    if plan.mode == "named":
        try:
            json.loads(text)
        except json.JSONDecodeError:
            return text, []
        return None, [tool_call(plan.function or "", text)]
    if plan.mode == "required":
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            return text, []
        calls = [c for c in map(_as_call, items if isinstance(items, list) else []) if c is not None]
        return (None, calls) if calls else (text, [])
    calls = []
    for block in _HERMES.findall(text):
        try:
            call = _as_call(json.loads(block))
        except json.JSONDecodeError:
            call = None
        if call is not None:
            calls.append(call)
    if not calls:
        return text, []
    content = _HERMES.sub("", text).strip()
    return content or None, calls


def hermes_text(tool_calls: list[Any]) -> str:
    """An assistant message's tool calls in Hermes form, for a chat template that does not render tool_calls."""
    blocks = []
    for call in tool_calls:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError:
            pass
        blocks.append(
            "<tool_call>\n" + json.dumps({"name": function.get("name"), "arguments": arguments}) + "\n</tool_call>"
        )
    return "\n".join(blocks)


_OPEN = "<tool_call>"


def _held_back(text: str) -> int:
    """Characters at the end of text that could begin a "<tool_call>" tag (held until decided)."""
    for n in range(min(len(_OPEN) - 1, len(text)), 0, -1):
        if _OPEN.startswith(text[-n:]):
            return n
    return 0


class ToolCallStream:
    """One streamed choice's chat deltas under a ToolPlan, as OpenAI streams calls: a first delta
    with the call's index, id, type and name (arguments ""), then argument pieces under the same index.
    A named function streams its arguments as they are generated; "required" outputs are parsed when
    complete (the calls' boundaries are known only then) and sent as one delta per call; "auto"
    streams its text as content up to the first "<tool_call>" tag, then sends the calls (and any
    text after them) when the output is complete."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0  # auto: characters of text already sent as content
        self.calls = 0

    def deltas(self, new_text: str, finished: bool) -> list[dict[str, Any]]:
        if self.plan.mode == "named":
            out = []
            if not self.calls:
                call = tool_call(self.plan.function or "", "")
                out.append({"tool_calls": [{"index": 0, **call}]})
                self.calls = 1
            if new_text:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": new_text}}]})
            return out
        self.text += new_text
        if self.plan.mode == "auto":
            return self._auto(finished)
        if not finished:
            return []
        content, calls = parse_tool_calls(self.plan, self.text)
        self.calls = len(calls)
        out = [{"content": content}] if content else []
        out += [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(calls)]
        return out

    def _auto(self, finished: bool) -> list[dict[str, Any]]:
        tag = self.text.find(_OPEN)
        out: list[dict[str, Any]] = []
        if not finished:
            until = tag if tag >= 0 else len(self.text) - _held_back(self.text)
            if until > self.sent:
                out.append({"content": self.text[self.sent : until]})
                self.sent = until
            return out
        _, calls = parse_tool_calls(self.plan, self.text)
        self.calls = len(calls)
        rest = self.text[self.sent :]
        if calls:
            rest = _HERMES.sub("", rest)
            rest = rest if rest.strip() else ""
        if rest:
            out.append({"content": rest})
        out += [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(calls)]
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.calls else reason
