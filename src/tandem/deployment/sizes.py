"""Sizes in the deployment file: bytes, or a number with a unit (2GiB, 512MiB, 1.5GB)."""

from __future__ import annotations

import re

__all__ = ["parse_bytes"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30,
          "ti": 1 << 40, "tib": 1 << 40}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: int | str) -> int:
    """A size in bytes: 1073741824, "1GiB", "1Gi", "512MiB", "1.5GB" (ValueError naming the problem)."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 2GiB, 512MiB or 1073741824")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.match(str(value))
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            raise ValueError("expected a size such as 2GiB, 512MiB or 1073741824")
        size = int(float(match.group(1)) * _UNITS[unit])
    if size < 0:
        raise ValueError("a size must be >= 0")
    return size
