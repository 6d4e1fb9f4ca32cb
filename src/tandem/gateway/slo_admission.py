"""The capacity policy's admission, live: each variant's replicas held to the SLO batch and the prompt-token
budget and pace of the length mix the gateway sees now, exactly as `tandem sim --admission-cap` models it.

`SloAdmission` is a router around the deployment's: a request for a variant goes through that variant's
`AdmissionCap`, whose request cap and prompt-token budget and pace (`policies.prefill_budget.admission`)
are remade from the variant's Profile and the gateway's demand window at most
once a `refresh_s` (the controller's tick), as the simulator does. Until the variant has a Profile and
finished requests to read a mix from, nothing is capped. A request no replica admits waits at the gateway
(the dispatcher's buffer): a fleet sized too small shows as TTFT, not as every running user's TPOT.

`feed_policy` wires it, with the `DemandObserver` (arrivals and SLO outcomes for the policy), into a
gateway whose policy is `capacity` with a TTFT SLO; other policies are left as they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tandem.contracts import Profile, ReplicaLoad
from tandem.gateway.observers import DemandObserver, also_observe
from tandem.schedule.policies import CapacityParams, TokenDemand
from tandem.schedule.policies.prefill_budget import PrefillBudget, admission
from tandem.schedule.routers import AdmissionCap, Router, RouteRequest

if TYPE_CHECKING:
    from tandem.gateway.wiring import Gateway

__all__ = ["SloAdmission", "feed_policy"]


class SloAdmission:
    def __init__(
        self,
        inner: Router,
        profile: Callable[[str], Profile | None],
        demand: Callable[[str, float], TokenDemand],
        params: CapacityParams,
        clock: Callable[[], float],
        refresh_s: float = 2.0,
    ) -> None:
        if params.ttft_slo_s is None:
            raise ValueError("SLO admission needs the capacity policy's ttft_slo_s")
        self.inner, self.profile, self.demand, self.params, self.clock = inner, profile, demand, params, clock
        self.refresh_s = refresh_s
        self.caps: dict[str, AdmissionCap] = {}
        self.limits: dict[str, tuple[float, int | None, PrefillBudget | None]] = {}  # variant -> (made at, cap, budget)

    def _current(self, variant: str) -> tuple[int | None, PrefillBudget | None]:
        now = self.clock()
        made = self.limits.get(variant)
        if made is None or now - made[0] >= self.refresh_s:
            profile, params = self.profile(variant), self.params
            cap = budget = None
            if profile is not None:
                live = self.demand(variant, now)
                delay = params.queue_share * params.ttft_slo_s
                cap, budget = admission(profile, params.tpot_slo_s, live, delay, params.chunk_tokens)
            if made is not None:  # a window with nothing finished keeps the last mix's limits
                cap, budget = cap if cap is not None else made[1], budget if budget is not None else made[2]
            made = (now, cap, budget)
            self.limits[variant] = made
        return made[1], made[2]

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> ReplicaLoad | None:
        if not replicas:
            return self.inner.choose(request, replicas)
        variant = replicas[0].variant  # the dispatcher routes within one variant at a time
        if variant not in self.caps:
            self.caps[variant] = AdmissionCap(
                self.inner, lambda: self._current(variant)[0], lambda: self._current(variant)[1], self.clock
            )
        return self.caps[variant].choose(request, replicas)


def feed_policy(gw: Gateway) -> bool:
    """Wire the capacity policy's live inputs into `gw` (one model's gateway): the SLO admission around its
    router and the demand observer. False (nothing wired) unless its policy is capacity with a TTFT SLO."""
    deployment, fleet = gw.deployment, gw.fleet
    params = deployment.policy_params
    if deployment.policy_name != "capacity" or not isinstance(params, CapacityParams) or params.ttft_slo_s is None:
        return False

    def profile(variant: str) -> Profile | None:  # the one the policy sizes the pool with, once measured
        pool = fleet.controller.pools.get(variant)
        found = pool.variant if pool is not None else fleet.variants.get(variant)
        return found.profile if found is not None else None

    interval = getattr(deployment, "interval_s", 2.0)
    gw.dispatcher.router = SloAdmission(gw.dispatcher.router, profile, fleet.demand.rate, params, gw.clock, interval)
    observer = DemandObserver(
        fleet.demand, lambda: fleet.controller.primary, gw.clock, (params.ttft_slo_s, params.tpot_slo_s)
    )
    gw.observer = also_observe(gw.observer, observer)
    return True
