"""Measured Profiles for the capacity policy, without torch in the gateway's process.

A variant's Profile is measured once by `tandem profile` in a child process (the optimization
layer's own command; minutes on a big model) and cached as JSON under
`$TANDEM_CACHE/profiles` (default ~/.cache/tandem), keyed by model, recipe and threads. The
gateway only reads the JSON: recipes stay text on this side of the contract.
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

__all__ = ["ProfileError", "cache_dir", "cached_profile", "profile_command"]

logger = logging.getLogger("tandem.gateway")

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]


class ProfileError(RuntimeError):
    """A Profile could not be measured; the message carries the measuring command's own error."""


def cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem"))


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
    return subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)


def cached_profile(
    model: str | None, recipe: str | None, threads: int | None, *, run: Runner = _run, cache: Path | None = None
) -> Profile:
    """A variant's measured Profile: from the cache, else measured now by `tandem profile` and cached."""
    key = json.dumps([str(Path(model).resolve()) if model else None, recipe, threads])
    path = (cache or cache_dir()) / "profiles" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if path.is_file():
        return Profile.from_json(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    logger.info("measuring the profile of %s (%s) for the capacity policy; cached at %s", recipe, model, path)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        measured = Path(scratch) / "profile.json"
        done = run(profile_command(model, recipe, threads, measured))
        if done.returncode != 0 or not measured.is_file():
            error = summarize_output(done.stderr or done.stdout or "") or f"exit code {done.returncode}"
            raise ProfileError(f"cannot measure the profile of recipe {recipe or '(default)'}: {error}")
        text = measured.read_text()
        profile = Profile.from_json(text)
        measured.replace(path)  # atomic: a gateway reading the cache never sees half a file
    return profile
