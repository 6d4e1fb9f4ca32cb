"""Profiles for the scheduling side: measured by a `tandem profile` child process, cached as JSON."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tandem.contracts import Profile
from tandem.schedule.profiles import ProfileError, cached_profile, load_profile, profile_command

PROFILE = Profile("int8", "cpu", "m", 1000, 64, 8, {1: 50.0, 8: 200.0}, 1000.0, 0.05, 3.0)


def test_the_profile_is_measured_once_in_a_child_process_and_cached(tmp_path):
    runs = []

    def run(argv):
        runs.append(list(argv))
        out = argv[argv.index("-o") + 1]
        with open(out, "w") as f:
            f.write(PROFILE.to_json() + "\n")
        return subprocess.CompletedProcess(argv, 0, "", "")

    assert cached_profile("m", "int8", 1, run=run, cache=tmp_path) == PROFILE
    assert cached_profile("m", "int8", 1, run=run, cache=tmp_path) == PROFILE
    assert len(runs) == 1 and runs[0][:4] == [sys.executable, "-m", "tandem.cli", "profile"]
    assert runs[0][runs[0].index("--recipe") + 1] == "int8" and runs[0][runs[0].index("--threads") + 1] == "1"
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 1


def test_a_failed_measurement_carries_the_commands_own_error(tmp_path):
    def run(argv):
        return subprocess.CompletedProcess(argv, 1, "", "Usage: ...\nError: unknown optimizer 'int9'\n")

    with pytest.raises(ProfileError, match="recipe int9: Error: unknown optimizer 'int9'"):
        cached_profile(None, "int9", None, run=run, cache=tmp_path)
    assert list((tmp_path / "profiles").glob("*.json")) == []


def test_the_default_recipe_is_left_to_the_profiler():
    argv = profile_command(None, None, None, output="/tmp/p.json")  # type: ignore[arg-type]
    assert "--recipe" not in argv and "--model" not in argv


def test_a_real_measurement_by_tandem_profile(serve_model_dir, tmp_path):
    profile = cached_profile(str(serve_model_dir), "baseline", 1, cache=tmp_path)
    assert profile.recipe == "baseline" and profile.decode_tokens_per_s and profile.max_slots >= 1
    assert cached_profile(str(serve_model_dir), "baseline", 1, cache=tmp_path) == profile  # from the cache


def test_a_damaged_cache_entry_is_measured_again(tmp_path):
    runs = []

    def run(argv):
        runs.append(argv)
        with open(argv[argv.index("-o") + 1], "w") as f:
            f.write(PROFILE.to_json())
        return subprocess.CompletedProcess(argv, 0, "", "")

    cached_profile(None, "int8", None, run=run, cache=tmp_path)
    (entry,) = (tmp_path / "profiles").glob("*.json")
    entry.write_text("{")
    assert cached_profile(None, "int8", None, run=run, cache=tmp_path) == PROFILE
    assert len(runs) == 2


def test_profile_files(tmp_path):
    good = tmp_path / "p.json"
    good.write_text(PROFILE.to_json())
    assert load_profile(good) == PROFILE
    bad = tmp_path / "bad.json"
    bad.write_text('{"recipe": "x"}')
    with pytest.raises(ProfileError, match="bad.json: not a Profile"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="missing.json: cannot read the Profile"):
        load_profile(tmp_path / "missing.json")
