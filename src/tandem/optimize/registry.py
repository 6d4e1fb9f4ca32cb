"""The optimizer registry and recipe parsing.

`register(name, optimizer)` adds a plug-in; `get(name)` returns it; third-party optimizers are found
through the entry-point group `tandem.optimizers` (each entry point loads an optimizer instance, or a
factory taking the recipe's keyword parameters). A recipe such as "int8+speculative(k=4)" is a `+`
list of names with optional `(key=value, ...)` parameters, applied left to right.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from tandem.contracts import InferenceOptimizer, OptimizedModel

__all__ = [
    "RecipeError",
    "RecipeStep",
    "register",
    "get",
    "names",
    "describe",
    "parse_recipe",
    "apply_recipe",
    "ENTRY_POINT_GROUP",
]

ENTRY_POINT_GROUP = "tandem.optimizers"
Factory = Callable[..., InferenceOptimizer]


class RecipeError(ValueError):
    """A recipe names an unknown optimizer or passes a bad parameter; the message lists valid ones."""


@dataclass(frozen=True)
class RecipeStep:
    name: str
    params: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.params)})"


# name -> factory(**params) -> optimizer. An instance registered directly takes no parameters
# unless it defines `with_params(**params)`.
_factories: dict[str, Factory] = {}
_entry_points_loaded = False


def register(name: str, optimizer: InferenceOptimizer | Factory, *, replace: bool = False) -> None:
    """Add an optimizer (an instance, or a factory taking the recipe's keyword parameters)."""
    if not re.fullmatch(r"[a-z][a-z0-9_\-]*", name):
        raise RecipeError(f"optimizer name {name!r} must be lowercase letters, digits, '-' or '_'")
    if name in _factories and not replace:
        raise RecipeError(f"an optimizer named {name!r} is already registered")
    # A class is a factory (its fields are the recipe's parameters), even though its class attributes
    # would satisfy the protocol's structural check.
    if isinstance(optimizer, InferenceOptimizer) and not isinstance(optimizer, type):
        instance = optimizer

        def factory(**params: Any) -> InferenceOptimizer:
            if not params:
                return instance
            with_params = getattr(instance, "with_params", None)
            if with_params is None:
                raise RecipeError(f"optimizer {name!r} takes no parameters, got {', '.join(params)}")
            return with_params(**params)

        _factories[name] = factory
    elif callable(optimizer):
        _factories[name] = optimizer
    else:
        raise RecipeError(f"{optimizer!r} is neither an InferenceOptimizer nor a factory of one")


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _factories:
            continue  # built-ins win; a plug-in cannot silently replace them
        try:
            register(ep.name, ep.load())
        except Exception as exc:  # a broken plug-in must not break tandem: report it on use
            message = f"optimizer plug-in {ep.name!r} ({ep.value}) failed to load: {exc}"

            def broken(_message: str = message, **_: Any) -> InferenceOptimizer:
                raise RecipeError(_message)

            _factories[ep.name] = broken


def names() -> list[str]:
    _load_entry_points()
    return sorted(_factories)


def get(name: str, **params: Any) -> InferenceOptimizer:
    _load_entry_points()
    if name not in _factories:
        raise RecipeError(f"unknown optimizer {name!r}; registered optimizers: {', '.join(names())}")
    try:
        return _factories[name](**params)
    except TypeError as exc:
        raise RecipeError(f"bad parameter for optimizer {name!r}: {exc}") from None


def describe() -> list[tuple[str, str, str]]:
    """(name, version, one-line description) of every optimizer with default parameters."""
    rows = []
    for name in names():
        try:
            opt = get(name)
            rows.append((name, opt.version, opt.description))
        except RecipeError as exc:
            rows.append((name, "?", str(exc)))
    return rows


_STEP = re.compile(r"^\s*([a-z][a-z0-9_\-]*)\s*(?:\((.*)\))?\s*$", re.S)


def _parse_params(name: str, text: str) -> tuple[tuple[str, Any], ...]:
    params = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise RecipeError(f"recipe step {name!r}: parameter {part!r} must be key=value")
        value = value.strip()
        if value.lower() in ("true", "false"):  # recipes are typed on command lines: accept any case
            params.append((key, value.lower() == "true"))
            continue
        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value  # bare words (paths, names) stay strings
        params.append((key, parsed))
    return tuple(params)


def parse_recipe(recipe: str) -> list[RecipeStep]:
    """ "int8+speculative(k=4)" -> [RecipeStep("int8"), RecipeStep("speculative", (("k", 4),))]."""
    if not isinstance(recipe, str) or not recipe.strip():
        raise RecipeError("the recipe is empty; registered optimizers: " + ", ".join(names()))
    steps = []
    depth, current = 0, ""
    for ch in recipe:  # split on '+' outside parentheses
        depth += ch == "("
        depth -= ch == ")"
        if ch == "+" and depth == 0:
            steps.append(current)
            current = ""
        else:
            current += ch
    steps.append(current)
    parsed = []
    for text in steps:
        match = _STEP.match(text)
        if not match:
            raise RecipeError(f"cannot parse recipe step {text.strip()!r} in {recipe!r} (expected name or name(k=v))")
        name, params = match.group(1), _parse_params(match.group(1), match.group(2) or "")
        if name not in names():
            raise RecipeError(f"unknown optimizer {name!r} in recipe {recipe!r}; registered: {', '.join(names())}")
        parsed.append(RecipeStep(name, params))
    return parsed


def apply_recipe(model: Any, recipe: str) -> OptimizedModel:
    """Parse `recipe` and apply its optimizers in order to a loaded model (or an OptimizedModel)."""
    steps = parse_recipe(recipe)
    current = model if isinstance(model, OptimizedModel) else OptimizedModel(model=model, recipe="baseline")
    for step in steps:
        optimizer = get(step.name, **dict(step.params))
        current = optimizer.optimize(current)
        current = current.with_changes(
            applied=(*current.applied, (optimizer.name, optimizer.version)),
        )
    return current.with_changes(recipe="+".join(str(s) for s in steps))
