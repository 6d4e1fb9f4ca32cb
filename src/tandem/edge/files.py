"""Settings files and their errors: one YAML/JSON loader and one wording of pydantic's complaints.

`load_mapping(path, what)` reads a YAML (or, by its .json suffix, JSON) mapping; every way it can
fail is a ConfigError naming the file. `describe_errors(exc, model)` turns a pydantic ValidationError
into "field.path: what is wrong (got X)" lines, and an unknown key into "unknown field (did you mean
...?)", with the suggestion from difflib over the keys that model accepts at that place.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["ConfigError", "describe_errors", "field_path", "known_here", "load_mapping", "suggest", "unknown_key"]


class ConfigError(ValueError):
    """A settings file or value is unusable; the message names the file, the field and the problem."""


def load_mapping(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """The mapping a YAML or JSON file holds (an empty file is an empty mapping). Not validated."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    is_json = path.suffix == ".json"
    try:
        raw = json.loads(text) if is_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if is_json else 'YAML'} ({' '.join(str(exc).split())})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the {what} must be a mapping of settings, got {type(raw).__name__}")
    return raw


def suggest(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """' (did you mean X?)' for the closest known name, else ''."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]}?)" if close else ""


def unknown_key(where: str, name: str, known: Sequence[str]) -> str:
    """The one wording of an unknown key: the suggestion if one is close, else the keys allowed there."""
    hint = suggest(name, known)
    if not hint and known:
        hint = f" (known: {', '.join(known)})"
    return f"{where}: unknown field{hint}"


def field_path(loc: Sequence[Any]) -> str:
    """('variants', 1, 'replicas', 'max') -> 'variants[1].replicas.max'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, unions, lists and dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple, set, frozenset, dict):
        return [m for arg in args for m in _models_in(arg)]
    if typing.get_origin(annotation) is typing.Annotated:
        return _models_in(args[0])
    return []


def known_here(model: type[BaseModel] | None, loc: Sequence[Any]) -> list[str]:
    """The field names `model` accepts at `loc` (the parent of an unknown key); [] if not a model there."""
    current = [model] if model is not None else []
    for part in loc:
        if isinstance(part, int):
            continue  # a list index: same item type
        current = [m for c in current if part in c.model_fields for m in _models_in(c.model_fields[part].annotation)]
    return sorted({name for c in current for name in c.model_fields})


def describe_errors(exc: ValidationError, model: type[BaseModel] | None = None, *, within: str = "") -> list[str]:
    """One line per problem: 'field.path: message' (under `within`, a path such as 'policy.params').

    `model` (the validated model) lets an unknown key suggest the names allowed at its place.
    """
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = field_path(((within,) if within else ()) + loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            lines.append(unknown_key(where, str(loc[-1]), known_here(model, loc[:-1])))
        elif kind == "missing":
            lines.append(f"{where}: required")
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            value = err.get("input")
            got = f" (got {value!r})" if "input" in err and not isinstance(value, dict | list) else ""
            lines.append(f"{where}: {message}{got}")
    return lines
