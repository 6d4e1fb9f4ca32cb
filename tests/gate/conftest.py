from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import LOOSE_LATENCY, profile


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict[str, Path]:
    """Profile files for runs that are not about cost: the same capacity on both sides."""
    root = tmp_path_factory.mktemp("profiles")
    out = {}
    for name, rates in (("same", {1: 50.0, 4: 180.0, 16: 500.0, 32: 700.0}), ("slower", {1: 30.0, 32: 300.0})):
        out[name] = root / f"{name}.json"
        out[name].write_text(profile(name, rates).to_json())
    return out


@pytest.fixture(scope="module")
def loose_latency(tmp_path_factory) -> Path:
    """Settings for runs that are not about latency (helpers.LOOSE_LATENCY)."""
    path = tmp_path_factory.mktemp("settings") / "gate.yaml"
    path.write_text(json.dumps({"gate": {"tolerances": LOOSE_LATENCY}}))  # JSON is YAML
    return path
