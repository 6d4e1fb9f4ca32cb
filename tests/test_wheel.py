"""Install anywhere: the wheel built from this repository, installed into a fresh venv in a temporary
directory with no checkout beside it, runs `tandem bench` on the bundled model from a directory outside
the repository (the model, its tokenizer, the trace and the held-out prompts are all package data).

The venv gets tandem's dependencies the way a user's does (pip, from the package index and the
machine's wheel cache: torch 2.13.0 is the CPU wheel there), and nothing else: transformers, a dev
extra, is absent, so the bench's transformers rows must skip themselves. One test, about a minute of
pip and half a minute of tandem on a quiet machine. (`tandem generate` on the bundled model is
tests/test_cli.py's and tests/zoo's; here the bench's row generates from the installed package.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a build needs: the package source and the project file (its readme is the long description).
SOURCES = ("src", "pyproject.toml", "README.md")


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_wheel_installs_into_a_fresh_venv_and_runs_outside_the_repository(tmp_path):
    # Build from a copy of the sources, so no build/ leftovers of the checkout end up in the wheel.
    source = tmp_path / "source"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist)]
    _run([*build, str(source)], tmp_path, env, 300)
    (wheel,) = dist.glob("tandem-*.whl")

    venv = tmp_path / "venv"
    # No pip of its own (ensurepip is seconds of CPU): this pip installs into it (`--python`).
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env, 120)
    python, tandem = venv / "bin" / "python", venv / "bin" / "tandem"
    # --no-compile: pip would byte-compile every module of torch and the rest (a minute of CPU on two
    # cores); Python compiles what it imports anyway, so the install is the same for what runs here.
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile", str(wheel)]
    _run(install, tmp_path, env, 600)

    # Nothing of the checkout: tandem comes from the venv, run from a directory of its own, with its
    # own cache (its C kernels are built from the package's sources), and transformers is absent.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**env, "VIRTUAL_ENV": str(venv), "TANDEM_CACHE": str(tmp_path / "cache")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    probe = "import importlib.util, tandem; print(tandem.__file__, importlib.util.find_spec('transformers'))"
    where, transformers = _run([str(python), "-c", probe], elsewhere, env, 120).stdout.split()
    assert Path(where).is_relative_to(venv) and transformers == "None"

    # One row and one round keep it short; the trace, the held-out prompts and the model are package data.
    bench = [str(tandem), "bench", "--requests", "4", "--recipes", "baseline", "--repeats", "1"]
    benched = _run([*bench, "--json", "bench.json"], elsewhere, env, 600)
    assert "transformers is not installed" in benched.stderr and "skipped" in benched.stderr
    results = json.loads((elsewhere / "bench.json").read_text())["results"]
    assert [r["recipe"] for r in results] == ["baseline"] and results[0]["output_tokens"] > 0
