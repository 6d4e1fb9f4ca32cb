"""One experiment: a trace served by every (variant, policy) pair, each priced and judged on the SLO.

How each policy is set up from the variant's Profile and the SLO (the same for every variant):

- `static-peak`: the fewest replicas that meet the SLO at the trace's peak minute
  (`sizing.static_peak_replicas`), held all along.
- `hpa`: Kubernetes' algorithm and defaults (10% tolerance, 300 s scale-down stabilization, up by
  max(100%, 4 pods) per 15 s) on in-flight requests per replica, target `utilization` x the
  Profile's SLO batch (the most concurrent sequences one replica serves within the TPOT SLO, with
  the trace's prompts beside them and within its KV budget): what an operator who load-tested a
  replica at the SLO would set.
- `kpa`: Knative's algorithm and defaults (60 s stable / 6 s panic windows, panic at 200%),
  container concurrency = the SLO batch, at target utilization `utilization` (Knative's default 0.7).
- `capacity`: tandem's policy on the Profile's capacity at the TPOT SLO, forecast over the cold
  start, with a persistent tier sized for the trace's quietest minute.
- `oracle`: the clairvoyant lower bound (`sim/oracle.py`): a schedule computed from the trace itself,
  looked up a cold start ahead; its margin over the fluid model is searched by simulation
  (ORACLE_MARGINS, the first whose attainment meets the target).

Every reactive policy keeps at least one replica (no scale to zero: with a cold start of a minute the
first request after it would miss any TTFT SLO).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tandem.contracts import Profile
from tandem.schedule.packing import NodeShape, PackItem, first_fit_decreasing, nodes_needed
from tandem.schedule.policies import (
    CapacityParams,
    HpaParams,
    KpaParams,
    Policy,
    ScaleLimits,
    StaticParams,
    hpa_limits,
    kpa_limits,
    make_policy,
    tier_replicas,
)
from tandem.schedule.routers import make_router
from tandem.schedule.variant import Variant
from tandem.sim.oracle import oracle_params
from tandem.sim.simulator import SimConfig, SimResult, simulate
from tandem.sim.sizing import StaticSizing, demand_series, quiet_demand, static_peak_replicas, trace_capacity
from tandem.sim.tenant_mix import attainment_by_class
from tandem.sim.trace import TraceRequest

__all__ = ["POLICY_NAMES", "PairResult", "SimVariant", "Slo", "describe_source", "run_experiment", "run_pair"]

POLICY_NAMES = ("static-peak", "hpa", "kpa", "capacity", "oracle")
ORACLE_MARGINS = (1.0, 1.1, 1.25, 1.4, 1.6, 2.0)  # the oracle's schedule x these, the first meeting the target wins
QUEUE_SHARE = 0.75  # of the TTFT SLO, the share a request may spend queued (capacity's and the oracle's budget)


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 2.0
    tpot_s: float = 0.1
    target: float = 0.99  # the share of requests static-peak is sized to keep within both

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0 or not 0 < self.target <= 1:
            raise ValueError("the SLO needs ttft_s > 0, tpot_s > 0 and a target in (0, 1]")


@dataclass(frozen=True)
class SimVariant:
    name: str
    profile: Profile
    usd_per_hour: float | None = None  # one replica-hour (all its accelerators); None: no cost columns

    def variant(self) -> Variant:
        return Variant(self.name, self.profile.recipe, profile=self.profile)


@dataclass(frozen=True)
class PairResult:
    variant: SimVariant
    policy: str
    sim: SimResult
    setup: dict[str, Any]  # how the policy was set up (its parameters, the static count, the tier)
    demand: list[tuple[float, float]]  # (minute start, replicas the traffic needs), for the plot
    wall_s: float
    router: str = "least-outstanding"

    def row(self) -> dict[str, Any]:
        """The JSON object of this pair."""
        sim, profile, price = self.sim, self.variant.profile, self.variant.usd_per_hour
        day = 86400.0 / sim.duration_s if sim.duration_s else 0.0
        replica_hours = sim.replica_seconds / 3600.0
        cost = replica_hours * price if price is not None else None
        tokens = sim.output_tokens
        return {
            "variant": self.variant.name,
            "policy": self.policy,
            "router": self.router,
            "recipe": profile.recipe,
            "hardware": profile.hardware,
            "profile_source": profile.source,
            "profile_source_note": describe_source(profile),
            "accelerators_per_replica": profile.accelerators,
            "usd_per_replica_hour": price,
            "duration_s": sim.duration_s,
            "requests": len(sim.requests),
            "served": sim.served,
            "lost": sim.lost,
            "unserved": sim.unserved,
            "replica_hours": replica_hours,
            "replica_hours_per_day": replica_hours * day,
            "accelerator_hours": replica_hours * profile.accelerators,
            "accelerator_hours_per_day": replica_hours * profile.accelerators * day,
            "peak_replicas": sim.max_live,
            "mean_replicas": sim.mean_replicas,
            "min_replicas": sim.min_live or 0,
            "slo_attainment": sim.slo_attainment,
            "prefix_hit_rate": sim.prefix_hit_rate,
            "slo_attainment_by_class": attainment_by_class(sim.requests, sim.meets_slo) or None,
            "ttft_p50_s": sim.quantile("ttft", 0.5),
            "ttft_p99_s": sim.quantile("ttft", 0.99),
            "tpot_p50_s": sim.quantile("tpot", 0.5),
            "tpot_p99_s": sim.quantile("tpot", 0.99),
            "output_tokens": tokens,
            "cost_usd": cost,
            "cost_usd_per_day": cost * day if cost is not None else None,
            "usd_per_million_output_tokens": cost / tokens * 1e6 if cost is not None and tokens else None,
            "scale_events": sim.decisions["up"] + sim.decisions["down"],
            "scale_ups": sim.decisions["up"],
            "scale_downs": sim.decisions["down"],
            "max_buffered": sim.max_buffered,
            "node_hours": sim.node_seconds / 3600.0 if "node" in self.setup else None,
            "node_hours_per_day": sim.node_seconds / 3600.0 * day if "node" in self.setup else None,
            "setup": self.setup,
            "simulated_s": sim.sim_seconds,
            "wall_s": self.wall_s,
        }


def describe_source(profile: Profile) -> str:
    """How a Profile came to be, for a report: measured here, imported, or projected (with its factor)."""
    if profile.source == "measured":
        return f"measured on {profile.hardware}" + (f" at {profile.measured_at}" if profile.measured_at else "")
    return profile.source_note or profile.source


def _policy(
    name: str,
    variant: SimVariant,
    slo: Slo,
    trace: Sequence[TraceRequest],
    duration_s: float,
    config: SimConfig,
    max_replicas: int,
    utilization: float,
    margin: float = 1.0,
    overrides: dict[str, Any] | None = None,
) -> tuple[Policy, ScaleLimits, dict[str, Any]]:
    profile = variant.profile
    cap = trace_capacity(trace, profile, slo.tpot_s)
    if name == "static-peak":
        sizing: StaticSizing = static_peak_replicas(trace, variant.variant(), config, slo.target)
        params = StaticParams(sizing.replicas)
        limits = ScaleLimits(min_replicas=sizing.replicas, max_replicas=max(sizing.replicas, 1))
        setup = {"replicas": sizing.replicas, "meets_slo_at_peak": sizing.meets_slo,
                 "peak_attainment": sizing.attainment, "peak_start_s": sizing.peak_start_s}  # fmt: skip
    elif name == "hpa":
        params = HpaParams(target=max(1.0, utilization * cap.batch))
        limits = hpa_limits(1, max_replicas)
        setup = {"target_concurrency": params.target, "utilization": utilization}
    elif name == "kpa":
        params = KpaParams(target_concurrency=float(cap.batch), target_utilization=utilization)
        limits = kpa_limits(1, max_replicas)
        setup = {"target_concurrency": params.target, "utilization": utilization}
    elif name == "capacity":
        quiet = quiet_demand(trace, profile, slo.tpot_s, duration_s)
        params = CapacityParams(
            tpot_slo_s=slo.tpot_s,
            ttft_slo_s=slo.ttft_s,
            min_tier_tokens_per_s=quiet.output_tokens_per_s,
            min_tier_prompt_tokens_per_s=quiet.prompt_tokens_per_s,
            min_tier_tokens_per_sequence=quiet.tokens_per_request,
        )
        params = replace(params, **(overrides or {}))
        limits = ScaleLimits(min_replicas=1, max_replicas=max_replicas)
        setup = {"min_tier_replicas": tier_replicas(profile, params), "slo_batch": cap.batch,
                 "slo_output_tokens_per_s": cap.output_tokens_per_s}  # fmt: skip
    elif name == "oracle":
        warm = [r for r in trace if r.arrival_s < config.warmup_s]
        span = max(config.warmup_s, warm[-1].arrival_s) if warm else 0.0
        seen = [replace(r, arrival_s=r.arrival_s - span) for r in warm] + list(trace)
        params = oracle_params(seen, profile, slo.tpot_s, QUEUE_SHARE * slo.ttft_s, duration_s, margin, config.tick_s)
        limits = ScaleLimits(min_replicas=1, max_replicas=max_replicas, max_scale_down_rate=1e9)
        setup = {"margin": margin, "window_s": 10.0, "lookahead_s": params.lookahead_s}
    else:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
    return make_policy(name, params), limits, setup


def run_pair(
    trace: Sequence[TraceRequest],
    variant: SimVariant,
    policy: str,
    slo: Slo,
    *,
    duration_s: float | None = None,
    config: SimConfig | None = None,
    node: NodeShape | None = None,
    max_replicas: int = 256,
    utilization: float = 0.7,
    overrides: dict[str, Any] | None = None,
    router: str = "least-outstanding",
) -> PairResult:
    """Simulate one (variant, policy) pair over `trace` (`overrides`: capacity's parameters to change)
    with the gateway's `router` (by name: tandem.schedule.routers.make_router)."""
    started = time.perf_counter()
    duration = duration_s if duration_s is not None else (trace[-1].arrival_s if trace else 0.0)
    config = replace(config or SimConfig(), ttft_slo_s=slo.ttft_s, tpot_slo_s=slo.tpot_s)
    nodes_for: Callable[[int], int] | None = None
    node_setup = None
    if node is not None:
        item = PackItem(variant.name, variant.profile.memory_bytes, variant.profile.accelerators)
        nodes_for = lambda n: nodes_needed([item] * n, node)  # noqa: E731
        node_setup = {"memory_bytes": node.memory_bytes, "accelerators": node.accelerators,
                      "replica_memory_bytes": item.memory_bytes,
                      "replicas_per_node": len(first_fit_decreasing([item] * 1024, node)[0])}  # fmt: skip
    tried = []
    for margin in ORACLE_MARGINS if policy == "oracle" else (1.0,):
        policy_fn, limits, setup = _policy(policy, variant, slo, trace, duration, config, max_replicas, utilization,
                                           margin, overrides)  # fmt: skip
        result = simulate(
            trace, variant.variant(), policy_fn, limits, make_router(router, random.Random(0)), config=config,
            policy_name=policy, duration_s=duration, nodes_for=nodes_for,
        )  # fmt: skip
        tried.append((margin, result.slo_attainment))
        if result.slo_attainment >= slo.target and result.lost == 0:
            break
    if policy == "oracle":
        setup["margins_tried"] = tried
        setup["meets_target"] = tried[-1][1] >= slo.target
    if node_setup is not None:
        setup["node"] = node_setup
    demand = demand_series(trace, variant.profile, slo.tpot_s, duration)
    return PairResult(variant, policy, result, setup, demand, time.perf_counter() - started, router)


def run_experiment(
    trace: Sequence[TraceRequest],
    variants: Sequence[SimVariant],
    policies: Sequence[str],
    slo: Slo,
    *,
    duration_s: float | None = None,
    config: SimConfig | None = None,
    node: NodeShape | None = None,
    max_replicas: int = 256,
    utilization: float = 0.7,
    progress: Callable[[str], None] | None = None,
    routers: Sequence[str] = ("least-outstanding",),
) -> list[PairResult]:
    """Every (variant, policy, router), variants outer. `utilization`: hpa's and kpa's target share of the SLO batch."""
    for name in policies:
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
    results = []
    for variant in variants:
        if trace_capacity(trace, variant.profile, slo.tpot_s).meets_slo is False and progress:
            progress(f"{variant.name}: even one sequence decodes slower than the TPOT SLO; capacity is best effort")
        for policy in policies:
            for router in routers:
                if progress:
                    progress(f"simulating {variant.name} x {policy}" + (f" x {router}" if len(routers) > 1 else ""))
                results.append(
                    run_pair(
                        trace,
                        variant,
                        policy,
                        slo,
                        duration_s=duration_s,
                        config=config,
                        node=node,
                        max_replicas=max_replicas,
                        utilization=utilization,
                        router=router,
                    )  # fmt: skip
                )
    return results
