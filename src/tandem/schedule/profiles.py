"""Measured Profiles for the scheduling side (the capacity policy, the gate's cost verdict), without torch.

A variant's Profile is measured once by `tandem profile` in a child process (the optimization
layer's own command; minutes on a big model) and cached as JSON under `$TANDEM_CACHE/profiles`
(default ~/.cache/tandem), keyed by model, recipe and threads, so the gateway and `tandem gate`
reuse what either measured. This side only reads JSON: recipes stay text across the contract.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from tandem.cluster.backend import summarize_output
from tandem.contracts import Profile

__all__ = ["ProfileError", "cache_dir", "cached_profile", "load_profile", "profile_command"]

logger = logging.getLogger("tandem.schedule")

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]
MEASURE_TIMEOUT_S = 1800.0


class ProfileError(RuntimeError):
    """No Profile could be had: the message names the file or the recipe, and why."""


def cache_dir() -> Path:
    """tandem's cache folder ($TANDEM_CACHE, default ~/.cache/tandem): profiles/, logs/, kernels/."""
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


def load_profile(path: str | Path) -> Profile:
    """A Profile JSON file (from `tandem profile -o`), or ProfileError naming the file."""
    path = Path(path)
    try:
        return Profile.from_json(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the Profile ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ProfileError(f"{path}: not a Profile ({exc})") from None


def profile_command(model: str | None, recipe: str | None, threads: int | None, output: Path) -> list[str]:
    """`python -m tandem.cli profile ...`: the recipe as text (none: the server's default recipe)."""
    argv = [sys.executable, "-m", "tandem.cli", "profile", "-o", str(output)]
    if model is not None:
        argv += ["--model", model]
    if recipe is not None:
        argv += ["--recipe", recipe]
    if threads is not None:
        argv += ["--threads", str(threads)]
    return argv


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False, timeout=MEASURE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 1, "", f"Error: measuring took over {MEASURE_TIMEOUT_S:g} s")


def cached_profile(
    model: str | None, recipe: str | None, threads: int | None, *, run: Runner = _run, cache: Path | None = None
) -> Profile:
    """A variant's measured Profile: from the cache, else measured now by `tandem profile` and cached.

    A damaged cache entry is measured again; a failed measurement carries the command's own error.
    """
    key = json.dumps([str(Path(model).resolve()) if model and Path(model).exists() else model, recipe, threads])
    path = (cache or cache_dir()) / "profiles" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.is_file():
        try:
            return load_profile(path)
        except ProfileError:
            logger.warning("%s: damaged cached Profile; measuring it again", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    logger.info("measuring the Profile of %s (%s); cached at %s", recipe or "the default recipe", model, path)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        measured = Path(scratch) / "profile.json"
        done = run(profile_command(model, recipe, threads, measured))
        if done.returncode != 0 or not measured.is_file():
            error = summarize_output(done.stderr or done.stdout or "") or f"exit code {done.returncode}"
            raise ProfileError(f"cannot measure the Profile of recipe {recipe or '(default)'}: {error}")
        profile = load_profile(measured)
        measured.replace(path)  # atomic: a reader of the cache never sees half a file
    return profile
