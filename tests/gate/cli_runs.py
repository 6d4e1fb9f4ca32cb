"""Running `tandem gate` as a user does (a subprocess, its JSON read back), for the gate's end-to-end
tests (test_cli.py, test_cli_failing_candidates.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tandem.kernels import cache_dir


def gate(tmp_path, *args, plugins: Path | None = None, timeout=300) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    env["TANDEM_CACHE"] = str(tmp_path / "cache")  # its own profiles ...
    (tmp_path / "cache").mkdir(exist_ok=True)
    if not (tmp_path / "cache" / "kernels").exists():  # ... and the kernels already built for this machine
        cache_dir().mkdir(parents=True, exist_ok=True)
        (tmp_path / "cache" / "kernels").symlink_to(cache_dir(), target_is_directory=True)
    if plugins is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugins), env.get("PYTHONPATH")]))
    out = tmp_path / "gate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "gate", "--json", str(out), "--log-dir", str(tmp_path / "logs"), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    result = json.loads(out.read_text()) if out.is_file() else {}
    return proc, result


def verdicts(result: dict) -> dict[str, str]:
    return {name: m["verdict"] for name, m in result["verdict"]["metrics"].items()}
