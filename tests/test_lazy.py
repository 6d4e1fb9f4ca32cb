"""tandem.lazy: a package's names, declared as imports under `if TYPE_CHECKING:`, load on first use."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

from tandem.lazy import lazy_exports

PACKAGES = ["tandem.gate", "tandem.gateway", "tandem.serve", "tandem.zoo"]


def _home_of(package: str, export: str) -> str:
    """The module the package's `if TYPE_CHECKING:` block imports `export` from, read as text."""
    source = importlib.util.find_spec(package).origin
    for line in open(source, encoding="utf-8"):
        line = line.strip()
        if line.startswith("from ") and " import " in line:
            module, _, names = line[5:].partition(" import ")
            if export in [n.strip() for n in names.split(",")]:
                return module
    raise AssertionError(f"{package}: {export} is not imported under TYPE_CHECKING")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_export_is_the_object_its_module_defines(name):
    package = importlib.import_module(name)
    assert package.__all__ and sorted(dir(package)) == sorted(package.__all__)
    for export in package.__all__:
        if importlib.util.find_spec(f"{name}.{export}") is not None:
            continue  # tandem.zoo.distill: once the sub-module is imported, Python binds its name on the package
        obj = getattr(package, export)
        home = importlib.import_module(_home_of(name, export))
        assert getattr(home, export) is obj, (name, export)
    with pytest.raises(AttributeError, match=f"module '{name}' has no attribute 'nothing_here'"):
        package.nothing_here  # noqa: B018


def test_importing_a_package_loads_none_of_its_exports():
    code = (
        "import sys, tandem.serve, tandem.gateway, tandem.gate, tandem.zoo\n"
        "print(sorted(m for m in sys.modules if m.startswith(('tandem.serve.', 'tandem.gateway.', 'tandem.gate.',"
        " 'tandem.zoo.')) or m in ('torch', 'uvicorn', 'scipy')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_the_block_is_read_from_the_file_and_relative_imports_resolve(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from tandem.contracts import Profile\n    from .lazy import lazy_exports as helper\n"
    )
    getattr_, dir_, names = lazy_exports("tandem", str(init))
    assert names == ["Profile", "helper"] and dir_() == names
    from tandem.contracts import Profile

    assert getattr_("Profile") is Profile and getattr_("helper") is lazy_exports
    init.write_text("import typing\nif typing.TYPE_CHECKING:\n    import json\n")
    with pytest.raises(TypeError, match="only `from MODULE import NAME`"):
        lazy_exports("tandem", str(init))
