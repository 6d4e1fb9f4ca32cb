"""Profiles for the cost verdict, got without torch in this process.

A Profile is measured by the optimization layer (`tandem profile`, which loads the model); the
gate runs it as a subprocess and caches the JSON where the gateway caches the Profiles it measures
($TANDEM_CACHE/profiles, default ~/.cache/tandem, keyed by model, recipe and threads), so each
variant is measured once per machine. Or an operator hands a Profile file over.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from tandem.contracts import Profile

__all__ = ["ProfileError", "load_profile", "measured_profile", "profile_cache_dir"]


class ProfileError(RuntimeError):
    """No Profile could be had: the message names the file or the recipe, and why."""


def profile_cache_dir() -> Path:
    return Path(os.environ.get("TANDEM_CACHE", Path.home() / ".cache" / "tandem")) / "profiles"


def _cache_key(model: str | None, recipe: str, threads: int | None) -> str:
    # The gateway's key (tandem serve --policy capacity), so either can reuse what the other measured.
    key = json.dumps([str(Path(model).resolve()) if model else None, recipe, threads])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        return Profile.from_json(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read the Profile ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ProfileError(f"{path}: not a Profile ({exc})") from None


def measured_profile(
    model: str | None,
    recipe: str,
    threads: int | None,
    *,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    cache_dir: Path | None = None,
    timeout_s: float = 1800.0,
) -> Profile:
    """The cached Profile of `recipe`, else measured now by `python -m tandem.cli profile` (a minute or so)."""
    cache = cache_dir or profile_cache_dir()
    path = cache / f"{_cache_key(model, recipe, threads)}.json"
    if path.is_file():
        try:
            return load_profile(path)
        except ProfileError:
            pass  # a damaged cache entry is measured again
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=cache, suffix=".json", delete=False) as handle:
        scratch = Path(handle.name)
    argv = [python, "-m", "tandem.cli", "profile", "--recipe", recipe, "-o", str(scratch)]
    argv += ["--model", model] if model else []
    argv += ["--threads", str(threads)] if threads else []
    try:
        proc = run(argv, capture_output=True, text=True, env=dict(env) if env is not None else None, timeout=timeout_s)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout or "").strip().splitlines()
            raise ProfileError(f"measuring the Profile of {recipe} failed: {lines[-1] if lines else proc.returncode}")
        profile = load_profile(scratch)
        scratch.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
        return profile
    except subprocess.TimeoutExpired:
        raise ProfileError(f"measuring the Profile of {recipe} took over {timeout_s:g} s") from None
    finally:
        scratch.unlink(missing_ok=True)
