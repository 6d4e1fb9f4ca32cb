"""Side: one variant as the gate knows it (its name, its measured Profile, its price)."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.contracts import Profile
from tandem.pricing import DEFAULT_PRICE

__all__ = ["Side"]


@dataclass(frozen=True)
class Side:
    """One variant as the gate knows it: its name, its measured Profile and its price."""

    name: str
    profile: Profile | None = None
    usd_per_hour: float = DEFAULT_PRICE[0]
    profile_error: str | None = None  # why there is no Profile, when there is none
