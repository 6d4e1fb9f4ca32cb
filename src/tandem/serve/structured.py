"""Structured output requests: OpenAI's response_format and vLLM's structured_outputs / guided_*
fields -> one GrammarSpec for the engine, checked before any work (a 400 naming the problem).

Accepted, on completions and chat, streaming or not:
- response_format: {"type": "text"}, {"type": "json_object"}, {"type": "json_schema",
  "json_schema": {"name", "schema", "strict", "description"}};
- structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object"} (vLLM >= 0.10);
- guided_json, guided_regex, guided_choice, guided_grammar (vLLM's older names), with
  guided_decoding_backend "auto", "guidance" or "llguidance" (the one engine here).
One constraint per request. An object schema with `properties` and no word on
`additionalProperties` is closed (additionalProperties: false, as OpenAI's strict mode and
xgrammar's default do): the output still validates against the schema as given, and a small model
cannot wander off into keys of its own. A schema the grammar engine cannot honour fully (an unimplemented
keyword, an unknown format) is refused naming the keyword, never loosened silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tandem.edge.errors import APIError
from tandem.engine import GrammarSpec, RequestError

__all__ = ["requested_grammar", "check_grammar", "json_schema_spec", "closed_objects"]

_BACKENDS = (None, "auto", "guidance", "llguidance")
_SO_KINDS = {"json": "json", "regex": "regex", "choice": "choice", "grammar": "grammar", "json_object": "json_object"}
# vLLM's other structured_outputs fields: accepted at the values that change nothing here.
_SO_NO_OPS = {
    "backend": _BACKENDS,
    "disable_fallback": (None, False, True),
    "disable_any_whitespace": (None, True),  # whitespace is always compact
    "disable_additional_properties": (None, False),
    "whitespace_pattern": (None,),
    "structural_tag": (None,),
}
_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


def _bad(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def closed_objects(schema: Any) -> Any:
    """The schema with every object that lists properties, and says nothing of others, closed to them."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(s) for name, s in out[key].items()}
    for key in _SUBSCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def json_schema_spec(schema: Any, param: str) -> GrammarSpec:
    """A JSON schema given as an object or as JSON text."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise _bad(param, f"the JSON schema is not valid JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise _bad(param, "the JSON schema must be a JSON object")
    return GrammarSpec("json", json.dumps(closed_objects(schema)))


def _response_format(value: dict[str, Any]) -> GrammarSpec | None:
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise _bad("response_format", "json_schema must be an object with a 'schema' (and a 'name')")
        unknown = sorted(set(spec) - _JSON_SCHEMA_KEYS)
        if unknown:
            raise _bad("response_format", f"json_schema has unknown field {unknown[0]!r}")
        if spec.get("strict") not in (None, True, False):
            raise _bad("response_format", "json_schema.strict must be a boolean")
        return json_schema_spec(spec["schema"], "response_format")
    raise _bad("response_format", f"type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def _choice(value: Any, param: str) -> GrammarSpec:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise _bad(param, "must be a non-empty list of non-empty strings")
    return GrammarSpec("choice", json.dumps(value))


def _text(value: Any, param: str, kind: str) -> GrammarSpec:
    if not isinstance(value, str) or not value:
        raise _bad(param, "must be a non-empty string")
    return GrammarSpec(kind, value)


def _structured_outputs(value: dict[str, Any]) -> list[tuple[str, GrammarSpec]]:
    found = []
    for key, item in value.items():
        param = f"structured_outputs.{key}"
        if key in _SO_NO_OPS:
            if item not in _SO_NO_OPS[key]:
                raise _bad(param, "not supported by this server", code="unsupported_parameter")
            continue
        if key not in _SO_KINDS:
            raise _bad(param, "unknown field", code="unknown_parameter")
        if item is None or item is False:
            continue
        kind = _SO_KINDS[key]
        if kind == "json":
            found.append((param, json_schema_spec(item, param)))
        elif kind == "json_object":
            found.append((param, GrammarSpec("json_object")))
        elif kind == "choice":
            found.append((param, _choice(item, param)))
        else:
            found.append((param, _text(item, param, kind)))
    return found


def requested_grammar(req: Any) -> tuple[str, GrammarSpec] | None:
    """(the field that asked, its spec), or None for unconstrained output; 400 on a malformed field."""
    found: list[tuple[str, GrammarSpec]] = []
    if req.response_format is not None:
        spec = _response_format(req.response_format)
        if spec is not None:
            found.append(("response_format", spec))
    if req.structured_outputs is not None:
        found += _structured_outputs(req.structured_outputs)
    if req.guided_json is not None:
        found.append(("guided_json", json_schema_spec(req.guided_json, "guided_json")))
    if req.guided_regex is not None:
        found.append(("guided_regex", _text(req.guided_regex, "guided_regex", "regex")))
    if req.guided_choice is not None:
        found.append(("guided_choice", _choice(req.guided_choice, "guided_choice")))
    if req.guided_grammar is not None:
        found.append(("guided_grammar", _text(req.guided_grammar, "guided_grammar", "grammar")))
    if req.guided_decoding_backend not in _BACKENDS:
        raise _bad(
            "guided_decoding_backend",
            f"{req.guided_decoding_backend!r} is not available; this server's grammar engine is llguidance",
            code="unsupported_parameter",
        )
    if req.guided_whitespace_pattern is not None:
        raise _bad("guided_whitespace_pattern", "not supported by this server", code="unsupported_parameter")
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise _bad(found[1][0], f"one output constraint per request, got {names}")
    return found[0] if found else None


def check_grammar(param: str, spec: GrammarSpec, check: Callable[[GrammarSpec], None] | None) -> None:
    """Compile the spec (cached by the engine) and turn its error into a 400 naming the field and the problem."""
    if check is None:
        return
    try:
        check(spec)
    except RequestError as exc:
        message = str(exc)
        what = {"json": "JSON schema", "json_object": "JSON schema", "regex": "regex", "choice": "choice"}
        kind = what.get(spec.kind, "grammar")
        if "Unimplemented keys" in message or "Unknown format" in message:
            raise _bad(param, f"the {kind} uses a feature this server does not support: {message}",
                       code="unsupported_value") from None  # fmt: skip
        raise _bad(param, f"invalid {kind}: {message}") from None
