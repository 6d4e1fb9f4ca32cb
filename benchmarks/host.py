"""The host a benchmark ran on, for its results (torch-free, so gateway-side benchmarks can use it)."""

from __future__ import annotations

from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
