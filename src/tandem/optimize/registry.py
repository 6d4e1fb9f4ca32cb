"""The optimizer registry and recipe parsing.

`register(name, optimizer)` adds a plug-in; `get(name)` returns it; third-party optimizers are found
through the entry-point group `tandem.optimizers` (each entry point loads an optimizer instance, or a
factory taking the recipe's keyword parameters). A recipe such as "int8+speculative(k=4)" is a `+`
list of names with optional `(key=value, ...)` parameters, applied left to right.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
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
    "parameters",
    "OptimizerParam",
    "parse_recipe",
    "validate_recipe",
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


@dataclass(frozen=True)
class OptimizerParam:
    """One parameter a recipe step may set: `speculative(k=4)`."""

    name: str
    type: str
    default: Any

    def __str__(self) -> str:
        return f"{self.name}: {self.type} = {self.default!r}"


# Every optimizer declares these; they are not recipe parameters.
_IDENTITY_FIELDS = frozenset({"name", "version", "description"})

# name -> factory(**params) -> optimizer. An instance registered directly takes no parameters
# unless it defines `with_params(**params)`.
_factories: dict[str, Factory] = {}
_registered: dict[str, Any] = {}  # name -> what was registered (an instance or a factory), for `parameters`
_entry_points_loaded = False


def register(name: str, optimizer: InferenceOptimizer | Factory, *, replace: bool = False) -> None:
    """Add an optimizer (an instance, or a factory taking the recipe's keyword parameters)."""
    if not re.fullmatch(r"[a-z][a-z0-9_\-]*", name):
        raise RecipeError(f"optimizer name {name!r} must be lowercase letters, digits, '-' or '_'")
    if name in _factories and not replace:
        raise RecipeError(f"an optimizer named {name!r} is already registered")
    # A class is a factory (its fields are the recipe's parameters), even though its class attributes
    # would satisfy the protocol's structural check.
    _registered[name] = optimizer
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
    known = parameters(name) if params else []
    unknown = sorted(set(params) - {p.name for p in known})
    if known and unknown:  # say what it takes rather than the dataclass's TypeError
        takes = ", ".join(str(p) for p in known)
        raise RecipeError(f"optimizer {name!r} has no parameter {', '.join(map(repr, unknown))}; it takes {takes}")
    for param in known:
        if param.name in params and not _fits(params[param.name], param.type):
            raise RecipeError(
                f"optimizer {name!r}: parameter {param.name!r} must be {param.type}, got {params[param.name]!r}"
            )
    try:
        return _factories[name](**params)
    except TypeError as exc:
        raise RecipeError(f"bad parameter for optimizer {name!r}: {exc}") from None
    except ValueError as exc:  # an optimizer's own range check (k must be in [1, 16], ...)
        raise RecipeError(str(exc)) from None


_SIMPLE_TYPES = {"int": int, "float": (int, float), "bool": bool, "str": str, "None": type(None)}


def _fits(value: Any, type_name: str) -> bool:
    """Whether a recipe value fits a declared type like "int", "float" or "str | None" (others: not checked)."""
    allowed = [_SIMPLE_TYPES.get(part.strip()) for part in type_name.split("|")]
    if any(t is None for t in allowed):
        return True
    if isinstance(value, bool) and bool not in allowed:  # bool is an int subclass; k=true is still wrong
        return False
    return isinstance(value, tuple(t for group in allowed for t in (group if isinstance(group, tuple) else (group,))))


def _type_name(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return text.replace("typing.", "")


def parameters(name: str) -> list[OptimizerParam]:
    """The recipe parameters of optimizer `name` with their types and defaults ([] if it takes none).

    Read from the optimizer's dataclass fields (the built-ins' and most plug-ins' shape), else from
    a factory's keyword arguments.
    """
    _load_entry_points()
    if name not in _factories:
        raise RecipeError(f"unknown optimizer {name!r}; registered optimizers: {', '.join(names())}")
    source = _registered.get(name)  # absent for a plug-in that failed to load
    if source is None:
        return []
    if dataclasses.is_dataclass(source):
        if not isinstance(source, type) and not hasattr(source, "with_params"):
            return []  # an instance without with_params takes no parameters
        return [
            OptimizerParam(f.name, _type_name(f.type), f.default)
            for f in dataclasses.fields(source)
            if f.init and f.name not in _IDENTITY_FIELDS and f.default is not dataclasses.MISSING
        ]
    try:
        signature = inspect.signature(source)
    except (TypeError, ValueError):
        return []
    return [
        OptimizerParam(p.name, _type_name(p.annotation) if p.annotation is not p.empty else "any", p.default)
        for p in signature.parameters.values()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is not p.empty
    ]


def describe() -> list[tuple[str, str, str, str]]:
    """(name, version, one-line description, parameters) of every optimizer with default parameters."""
    rows = []
    for name in names():
        try:
            opt = get(name)
            params = ", ".join(str(p) for p in parameters(name))
            rows.append((name, opt.version, opt.description, params))
        except RecipeError as exc:
            rows.append((name, "?", str(exc), ""))
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


def validate_recipe(recipe: str) -> list[RecipeStep]:
    """Parse `recipe` and build each step's optimizer (no model needed), so an unknown optimizer or
    parameter, or a value out of range, is a RecipeError before anything loads."""
    steps = parse_recipe(recipe)
    for step in steps:
        try:
            get(step.name, **dict(step.params))
        except RecipeError as exc:
            raise RecipeError(f"recipe {recipe!r}: {exc}") from None
    return steps


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
