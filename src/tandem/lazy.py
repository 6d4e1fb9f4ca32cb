"""Package names that load on first use, declared once as ordinary imports under `if TYPE_CHECKING:`.

A package whose names pull in heavy modules (uvicorn, scipy, torch) but whose sub-modules must stay
light to import (`tandem --help` imports `tandem.serve.options`, which runs `tandem/serve/__init__.py`)
writes its exports as imports that run only for type checkers and import-linter, and hands them to
`lazy_exports`, which reads that block and loads each name from its module when first asked for:

    from typing import TYPE_CHECKING

    from tandem.lazy import lazy_exports

    if TYPE_CHECKING:
        from tandem.serve.app import create_app

    __getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)

So the names are declared in one place, type checkers and editors see the real objects, and
import-linter sees the package's imports (a `__getattr__` with module names in strings hid them).
Standard library only.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["lazy_exports"]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _homes(package: str, source: str) -> dict[str, str]:
    """name -> the module it is imported from, for each `from M import name` under `if TYPE_CHECKING:`."""
    homes: dict[str, str] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for statement in node.body:
            if not isinstance(statement, ast.ImportFrom):
                raise TypeError(f"{package}: only `from MODULE import NAME` belongs under `if TYPE_CHECKING:`")
            module = statement.module or ""
            if statement.level:  # from .app import create_app
                module = importlib.util.resolve_name("." * statement.level + module, package)
            for alias in statement.names:
                homes[alias.asname or alias.name] = f"{module}:{alias.name}"
    return homes


def lazy_exports(package: str, init_file: str) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """`__getattr__`, `__dir__` and `__all__` for `package`, whose `__init__.py` is `init_file`."""
    homes = _homes(package, Path(init_file).read_text(encoding="utf-8"))
    names = sorted(homes)

    def __getattr__(name: str) -> Any:  # noqa: N807 (the module hook's own name)
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = homes[name].partition(":")
        return getattr(importlib.import_module(module), attribute)

    def __dir__() -> list[str]:  # noqa: N807
        return list(names)

    return __getattr__, __dir__, names
