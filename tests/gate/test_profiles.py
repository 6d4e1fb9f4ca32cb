"""Profiles for the cost verdict: measured by a `tandem profile` subprocess once, then from the cache."""

import subprocess
from pathlib import Path

import pytest

from tandem.gate.profiles import ProfileError, load_profile, measured_profile

from .helpers import profile


class FakeRun:
    """Stands in for subprocess.run: writes the Profile where `-o` says, or fails."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        if self.fail:
            return subprocess.CompletedProcess(argv, 1, "", f"Traceback ...\nError: {self.fail}\n")
        recipe = argv[argv.index("--recipe") + 1]
        Path(argv[argv.index("-o") + 1]).write_text(profile(recipe).to_json())
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_measured_once_then_cached(tmp_path):
    run = FakeRun()
    first = measured_profile("models/m", "int8", 1, run=run, python="py", cache_dir=tmp_path)
    again = measured_profile("models/m", "int8", 1, run=run, python="py", cache_dir=tmp_path)
    assert first == again == profile("int8") and len(run.calls) == 1
    argv = run.calls[0]
    assert argv[:5] == ["py", "-m", "tandem.cli", "profile", "--recipe"] and argv[argv.index("--threads") + 1] == "1"
    assert argv[argv.index("--model") + 1] == "models/m"
    assert len(list(tmp_path.glob("*.json"))) == 1  # no scratch files left behind
    measured_profile("models/m", "int8", 2, run=run, python="py", cache_dir=tmp_path)  # other threads: other key
    assert len(run.calls) == 2


def test_a_failed_measurement_names_the_recipe_and_the_error(tmp_path):
    with pytest.raises(ProfileError, match=r"measuring the Profile of nope failed: Error: unknown optimizer 'nope'"):
        measured_profile(None, "nope", None, run=FakeRun("unknown optimizer 'nope'"), cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_cache_entry_is_measured_again(tmp_path):
    run = FakeRun()
    measured_profile(None, "int8", None, run=run, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.json")
    entry.write_text("{")
    assert measured_profile(None, "int8", None, run=run, cache_dir=tmp_path) == profile("int8")
    assert len(run.calls) == 2


def test_profile_files(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(profile("bf16").to_json())
    assert load_profile(good).recipe == "bf16"
    bad = tmp_path / "bad.json"
    bad.write_text('{"recipe": "x"}')
    with pytest.raises(ProfileError, match="bad.json: not a Profile"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="missing.json: cannot read the Profile"):
        load_profile(tmp_path / "missing.json")
