"""The deployment as the rest of tandem reads it: frozen dataclasses (what `parse_deployment` returns)."""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tandem.gate.config import GateConfig
from tandem.schedule.breaker import BreakerConfig
from tandem.schedule.controller import ControllerConfig, Pool
from tandem.schedule.fallback import FallbackPlan
from tandem.schedule.policies import POLICIES, Policy, ScaleLimits
from tandem.schedule.routers import Router, make_router
from tandem.schedule.variant import Variant

__all__ = ["BackendPlan", "Deployment", "VariantPlan"]


@dataclass(frozen=True)
class VariantPlan:
    variant: Variant
    limits: ScaleLimits
    regions: tuple[str, ...]


@dataclass(frozen=True)
class BackendPlan:
    """Where the replicas run: `local` processes, or a `ray` cluster (at `address`; None: as ray.init finds one)."""

    name: str = "local"
    address: str | None = None


@dataclass(frozen=True)
class Deployment:
    plans: tuple[VariantPlan, ...]
    primary: str
    fallback: str | None
    policy_name: str
    policy_params: Any
    interval_s: float
    router_name: str
    router_params: Mapping[str, Any]
    breaker: BreakerConfig
    controller: ControllerConfig
    max_attempts: int
    backend: BackendPlan = BackendPlan()
    gate: GateConfig | None = None  # a candidate on shadow traffic, judged by tandem.gate

    @property
    def variants(self) -> dict[str, Variant]:
        return {plan.variant.name: plan.variant for plan in self.plans}

    def policy(self) -> Policy:
        function, _ = POLICIES[self.policy_name]
        return functools.partial(function, params=self.policy_params)

    def pools(self) -> list[Pool]:
        """One pool per variant, the primary first (what `Controller` takes)."""
        ordered = sorted(self.plans, key=lambda plan: plan.variant.name != self.primary)
        return [Pool(p.variant, self.policy_name, self.policy(), p.limits, p.regions) for p in ordered]

    def fallback_plan(self) -> FallbackPlan:
        return FallbackPlan(primary=self.primary, fallback=self.fallback, max_attempts=self.max_attempts)

    def router(self, rng: random.Random | None = None) -> Router:
        return make_router(self.router_name, rng, **self.router_params)
