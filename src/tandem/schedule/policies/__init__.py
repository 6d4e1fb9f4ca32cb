"""Autoscaling policies: pure functions `(ScaleContext) -> (desired_replicas, PolicyState)`.

`make_policy(name, params)` binds a policy's parameters, giving the one-argument callable the
controller and the simulator call every tick.
"""

from __future__ import annotations

import functools
from typing import Any

from tandem.schedule.policies.capacity import CapacityParams, capacity, tier_replicas
from tandem.schedule.policies.context import (
    Policy,
    PolicyState,
    ScaleContext,
    ScaleLimits,
    TokenDemand,
    apply_limits,
)
from tandem.schedule.policies.hpa import HpaParams, hpa, hpa_limits
from tandem.schedule.policies.kpa import KpaParams, kpa, kpa_limits
from tandem.schedule.policies.oracle import OracleParams, oracle
from tandem.schedule.policies.slo import SloCapacity, slo_capacity
from tandem.schedule.policies.static import StaticParams, static_peak

__all__ = [
    "POLICIES",
    "CapacityParams",
    "HpaParams",
    "KpaParams",
    "OracleParams",
    "Policy",
    "PolicyState",
    "ScaleContext",
    "ScaleLimits",
    "SloCapacity",
    "StaticParams",
    "TokenDemand",
    "apply_limits",
    "capacity",
    "hpa",
    "hpa_limits",
    "kpa",
    "kpa_limits",
    "make_policy",
    "oracle",
    "slo_capacity",
    "static_peak",
    "tier_replicas",
]

POLICIES: dict[str, tuple[Any, type]] = {
    "hpa": (hpa, HpaParams),
    "kpa": (kpa, KpaParams),
    "capacity": (capacity, CapacityParams),
    "static-peak": (static_peak, StaticParams),
    "oracle": (oracle, OracleParams),
}


def make_policy(name: str, params: Any = None) -> Policy:
    """The named policy with its parameters bound (defaults when `params` is None)."""
    try:
        function, params_type = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
    if params is None:
        params = params_type()
    if not isinstance(params, params_type):
        raise TypeError(f"policy {name!r} takes {params_type.__name__}, not {type(params).__name__}")
    return functools.partial(function, params=params)
