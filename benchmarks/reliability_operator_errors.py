"""The operator errors of issue 22, as scenarios of benchmarks/reliability.py: each starts `tandem serve`
gateways of its own and reports how they end (ready, or exited with which code and which last error,
and how long it took), bounded by a deadline.

- long_recipe: a 287-character valid recipe (it should serve) and as long a one with a typo (it
  should end the gateway with exit 1 and the replica's own error, within a minute), both at once.
- overlapping_ports: --replica-ports holding the gateway's own --port (it should exit 1 at once,
  saying so, not log "no free port" every second).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from server_process import _environment, free_port  # noqa: E402

LONG_VALID = "+".join(["baseline"] * 32)  # 287 characters, a valid recipe
LONG_BAD = "int8+speculatve(k=2,draft=/srv/models/" + "a-draft-model-directory/" * 10 + "draft)"  # a typo


def _gateway_cli(args: list[str], log: Path, deadline_s: float, ready: bool) -> dict:
    """Run `tandem serve ARGS` (a gateway) until it exits, or (`ready`) answers /ready, or the deadline."""
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "serve", *args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=_environment(None))
    started, outcome = time.monotonic(), "deadline"
    try:
        while time.monotonic() - started < deadline_s:
            if proc.poll() is not None:
                outcome = "exited"
                break
            if ready:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                        outcome = "ready"
                        break
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        seconds = round(time.monotonic() - started, 1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if " ERROR " in line or line.startswith("Error:")]
    return {
        "outcome": outcome, "seconds": seconds, "exit_code": proc.returncode if outcome == "exited" else None,
        "log_lines": len(lines), "last_error": (errors[-1][:400] if errors else None),
        "file_name_too_long_lines": text.count("File name too long"), "no_free_port_lines": text.count("no free port"),
    }  # fmt: skip


def long_recipe(logs: Path, deadline_s: float = 120.0) -> dict:
    """A 287-character valid recipe (should serve) and as long a one with a typo (should exit 1 fast,
    with the replica's own error), each as a gateway's primary, both at once."""

    def run(name: str, recipe: str, ready: bool) -> dict:
        args = ["--recipe", recipe, "--threads", "1", "--replicas-max", "1", "--policy", "hpa",
                "--log-dir", str(logs / f"{name}-replicas")]  # fmt: skip
        result = _gateway_cli(args, logs / f"{name}-gateway.log", deadline_s, ready)
        names = [p.name for p in (logs / f"{name}-replicas").glob("*.log")]
        return {"recipe_chars": len(recipe), **result, "longest_log_file_name": max(map(len, names), default=0)}

    with ThreadPoolExecutor(2) as pool:
        valid = pool.submit(run, "long-valid", LONG_VALID, True)
        bad = pool.submit(run, "long-bad", LONG_BAD, False)
        return {"valid": valid.result(), "with_a_typo": bad.result()}


def overlapping_ports(logs: Path, deadline_s: float = 30.0) -> dict:
    """--replica-ports holding the gateway's own --port: it should exit 1 at once, saying so."""
    log = logs / "overlap-gateway.log"
    port = free_port()
    argv = [sys.executable, "-m", "tandem.cli", "serve", "--recipe", "baseline", "--replicas-max", "1", "--policy",
            "hpa", "--host", "127.0.0.1", "--port", str(port), "--replica-ports", f"{port}-{port}",
            "--log-dir", str(logs / "overlap-replicas")]  # fmt: skip
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s, env=_environment(None))
        outcome, code, text = "exited", done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        outcome, code = "deadline", None
        text = "".join(
            o.decode(errors="replace") if isinstance(o, bytes) else o for o in (exc.stdout or "", exc.stderr or "")
        )
    log.write_text(text)
    lines = [line for line in text.splitlines() if line.strip()]
    return {
        "outcome": outcome, "seconds": round(time.monotonic() - started, 1), "exit_code": code,
        "last_line": lines[-1][-300:] if lines else None, "no_free_port_lines": text.count("no free port"),
    }  # fmt: skip


OPERATOR_SCENARIOS: dict[str, Callable[[Path], dict]] = {
    "long_recipe": long_recipe,
    "overlapping_ports": overlapping_ports,
}
