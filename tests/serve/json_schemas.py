"""Twenty JSON schemas of varied shape for the structured-output tests: nested objects, arrays with
min/max items, enums, numbers with ranges, string patterns, anyOf, required and optional fields.
Strings are bounded, and numbers have a multipleOf (exact in binary, as jsonschema checks it in
floats), so that a tiny model's sampled output completes within max_tokens (free digits can run on)."""

S = {"type": "string", "maxLength": 12}

SCHEMAS: list[dict] = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 3}},
     "required": ["tags"]},
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.125}},
     "required": ["score"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": {"type": "integer",
     "minimum": 1, "maximum": 9999}, "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
     "required": ["id", "email"], "additionalProperties": False}}, "required": ["user"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5},
     {"type": "null"}]}}, "required": ["value"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"title": S, "note": S}, "required": ["title"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "integer",
     "minimum": -100, "maximum": 100}, "y": {"type": "integer", "minimum": -100, "maximum": 100}},
     "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {"type": "object",
     "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}, "qty": {"type": "integer",
     "minimum": 1, "maximum": 10}}, "required": ["sku", "qty"], "additionalProperties": False}}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "event"}, "day": {"enum": ["mon", "tue", "wed"]}},
     "required": ["kind", "day"], "additionalProperties": False},
    {"type": "object", "properties": {"id": {"anyOf": [{"type": "string", "pattern": "^u[0-9]{3}$"},
     {"type": "integer", "minimum": 0, "maximum": 999}]}}, "required": ["id"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type":
     "array", "minItems": 1, "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000, "multipleOf": 0.25},
     "currency": {"enum": ["USD", "EUR"]}, "discount": {"type": "number", "minimum": 0, "maximum": 0.5,
     "multipleOf": 0.125}},
     "required": ["price", "currency"], "additionalProperties": False},
    {"type": "string", "pattern": "^(yes|no|maybe)$"},
    {"type": "object", "properties": {"flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 3,
     "maxItems": 3}}, "required": ["flags"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties":
     {"c": {"enum": [1, 2, 3]}}, "required": ["c"], "additionalProperties": False}}, "required": ["b"],
     "additionalProperties": False}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 18, "maximum": 99},
     "role": {"enum": ["admin", "user"]}, "nick": S}, "required": ["name", "role"], "additionalProperties": False},
]  # fmt: skip
