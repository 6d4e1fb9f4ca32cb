"""The optimizer registry and recipe parsing.

`register(name, optimizer)` adds a plug-in; `get(name)` returns it; third-party optimizers are found
through the entry-point group `tandem.optimizers` (each entry point loads an optimizer instance, or a
factory taking the recipe's keyword parameters). A recipe such as "int8+speculative(k=4)" is a `+`
list of names with optional `(key=value, ...)` parameters, applied left to right.

A name can hold several versions of an optimizer (each registration with its own `version`), so a
new version ships beside the one it may replace and the validation gate can compare them: a bare
name means the name's default version (the first registered, unless a later one is registered with
default=True), and `name@version` picks one, e.g. "int8+speculative@2.0(k_max=8)".
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

from tandem.optimize.types import InferenceOptimizer, OptimizedModel

__all__ = [
    "RecipeError",
    "RecipeStep",
    "register",
    "get",
    "names",
    "versions",
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
    name: str  # "speculative", or "speculative@2.0" for a version other than the default
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

# name -> version -> factory(**params) -> optimizer ("" when a factory does not say its version). An
# instance registered directly takes no parameters unless it defines `with_params(**params)`.
_factories: dict[str, dict[str, Factory]] = {}
_defaults: dict[str, str] = {}  # name -> the version a bare name means
# (name, version) -> what was registered (an instance or a factory), for `parameters`
_registered: dict[tuple[str, str], Any] = {}
_entry_points_loaded = False
_VERSION = re.compile(r"[0-9][0-9a-z.\-]*")


def _version_of(optimizer: Any) -> str:
    version = getattr(optimizer, "version", "")  # an instance's, or a class's field default
    return version if isinstance(version, str) and _VERSION.fullmatch(version) else ""


def register(
    name: str, optimizer: InferenceOptimizer | Factory, *, replace: bool = False, default: bool = False
) -> None:
    """Add an optimizer (an instance, or a factory taking the recipe's keyword parameters).

    A registration whose version differs from the name's registered ones adds a version beside them
    (the first stays the default unless `default`); the same version again needs `replace`."""
    if not re.fullmatch(r"[a-z][a-z0-9_\-]*", name):
        raise RecipeError(f"optimizer name {name!r} must be lowercase letters, digits, '-' or '_'")
    version = _version_of(optimizer)
    versions = _factories.get(name, {})
    clash = version in versions or (versions and (not version or "" in versions))
    if clash and not replace:
        raise RecipeError(f"an optimizer named {name!r} is already registered")
    if replace and clash:
        versions = {}  # a replacement takes the name over: no stale versions beside it
        for key in [k for k in _registered if k[0] == name]:
            del _registered[key]
    _factories[name] = versions
    if default or name not in _defaults or not versions:
        _defaults[name] = version
    # A class is a factory (its fields are the recipe's parameters), even though its class attributes
    # would satisfy the protocol's structural check.
    _registered[(name, version)] = optimizer
    if isinstance(optimizer, InferenceOptimizer) and not isinstance(optimizer, type):
        instance = optimizer

        def factory(**params: Any) -> InferenceOptimizer:
            if not params:
                return instance
            with_params = getattr(instance, "with_params", None)
            if with_params is None:
                raise RecipeError(f"optimizer {name!r} takes no parameters, got {', '.join(params)}")
            return with_params(**params)

        versions[version] = factory
    elif callable(optimizer):
        versions[version] = optimizer
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

            _factories[ep.name] = {"": broken}
            _defaults[ep.name] = ""


def names() -> list[str]:
    _load_entry_points()
    return sorted(_factories)


def versions(name: str) -> list[str]:
    """The registered versions of an optimizer, the default first ("" for a factory without one)."""
    _load_entry_points()
    if name not in _factories:
        raise RecipeError(f"unknown optimizer {name!r}; registered optimizers: {', '.join(names())}")
    return sorted(_factories[name], key=lambda v: (v != _defaults[name], v))


def _resolve(name: str) -> tuple[str, str]:
    """("speculative", "2.0") for "speculative@2.0"; a bare name means its default version."""
    base, _, version = name.partition("@")
    known = versions(base)
    version = version if "@" in name else _defaults[base]
    if version not in known:
        listed = ", ".join(f"{base}@{v}" for v in known if v)
        raise RecipeError(f"optimizer {base!r} has no version {version!r}; registered: {listed}")
    return base, version


def _factory(name: str) -> Factory:
    """The factory for "name" (its default version) or "name@version"."""
    base, version = _resolve(name)
    return _factories[base][version]


def get(name: str, **params: Any) -> InferenceOptimizer:
    """An optimizer by name ("speculative") or name and version ("speculative@2.0")."""
    factory = _factory(name)
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
        return factory(**params)
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
    """The recipe parameters of optimizer `name` (or `name@version`) with their types and defaults
    ([] if it takes none).

    Read from the optimizer's dataclass fields (the built-ins' and most plug-ins' shape), else from
    a factory's keyword arguments.
    """
    source = _registered.get(_resolve(name))  # absent for a plug-in that failed to load
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
    """(name, version, one-line description, parameters) of every optimizer version with default
    parameters; a name's default version comes first."""
    rows = []
    for name in names():
        for version in versions(name):
            spec = f"{name}@{version}" if version else name
            try:
                opt = get(spec)
                params = ", ".join(str(p) for p in parameters(spec))
                rows.append((name, opt.version, opt.description, params))
            except RecipeError as exc:
                rows.append((name, version or "?", str(exc), ""))
    return rows


_STEP = re.compile(r"^\s*([a-z][a-z0-9_\-]*(?:@[0-9][0-9a-z.\-]*)?)\s*(?:\((.*)\))?\s*$", re.S)


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
        if name.partition("@")[0] not in names():
            raise RecipeError(f"unknown optimizer {name!r} in recipe {recipe!r}; registered: {', '.join(names())}")
        _factory(name)  # an unknown version is an error here too, before anything loads
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
