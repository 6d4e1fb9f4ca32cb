"""Sizing a fleet from a trace and a Profile: how much work the traffic is, where its peak and its
quietest minute are, and the static-peak count (the fewest replicas meeting the SLO at the peak).

Work is counted in replica-seconds at the SLO: a request costs its prompt at the Profile's prefill
rate plus its output at the per-replica throughput of the largest batch that still meets the TPOT
SLO with the trace's prompts prefilled alongside (`slo_capacity`, the capacity policy's measure).
Work per second is the replicas the traffic needs at 100% use; the plots draw it as "demand".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tandem.contracts import Profile
from tandem.schedule.policies import ScaleLimits, SloCapacity, StaticParams, make_policy, slo_capacity
from tandem.schedule.variant import Variant
from tandem.sim.simulator import SimConfig, simulate
from tandem.sim.trace import TraceRequest

__all__ = [
    "QuietDemand",
    "StaticSizing",
    "demand_series",
    "peak_window",
    "quiet_demand",
    "static_peak_replicas",
    "trace_capacity",
    "trace_mix",
]


def trace_mix(trace: Sequence[TraceRequest]) -> float:
    """Prompt tokens per output token over the whole trace."""
    output = sum(r.output_tokens for r in trace)
    return sum(r.prompt_tokens for r in trace) / output if output else 0.0


def trace_capacity(trace: Sequence[TraceRequest], profile: Profile, tpot_slo_s: float) -> SloCapacity:
    """One replica's capacity at the TPOT SLO when it serves this trace's prompt mix and lengths."""
    per_request = sum(r.prompt_tokens + r.output_tokens for r in trace) / len(trace) if trace else 0.0
    return slo_capacity(profile, tpot_slo_s, trace_mix(trace), per_request)


def _cost(profile: Profile, cap: SloCapacity):
    prefill = profile.prefill_tokens_per_s

    def seconds(r: TraceRequest) -> float:
        return (r.prompt_tokens / prefill if prefill > 0 else 0.0) + r.output_tokens / cap.output_tokens_per_s

    return seconds


def demand_series(
    trace: Sequence[TraceRequest], profile: Profile, tpot_slo_s: float, duration_s: float, bucket_s: float = 60.0
) -> list[tuple[float, float]]:
    """(bucket start, replicas the bucket's arrivals need at the SLO at 100% use) for each bucket."""
    cost = _cost(profile, trace_capacity(trace, profile, tpot_slo_s))
    buckets = [0.0] * max(1, math.ceil(duration_s / bucket_s))
    for r in trace:
        if 0 <= r.arrival_s < duration_s:
            buckets[int(r.arrival_s // bucket_s)] += cost(r)
    return [(i * bucket_s, work / bucket_s) for i, work in enumerate(buckets)]


def peak_window(trace: Sequence[TraceRequest], profile: Profile, tpot_slo_s: float, window_s: float = 60.0):
    """(start, replicas needed) of the `window_s` window (starting at an arrival) with the most work."""
    cost = _cost(profile, trace_capacity(trace, profile, tpot_slo_s))
    best, best_start, work, left = 0.0, 0.0, 0.0, 0
    for r in trace:
        work += cost(r)
        while trace[left].arrival_s <= r.arrival_s - window_s:
            work -= cost(trace[left])
            left += 1
        if work > best:
            best, best_start = work, trace[left].arrival_s
    return best_start, best / window_s


@dataclass(frozen=True)
class QuietDemand:
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    tokens_per_request: float


def quiet_demand(
    trace: Sequence[TraceRequest], profile: Profile, tpot_slo_s: float, duration_s: float, bucket_s: float = 60.0
) -> QuietDemand:
    """Token rates of the trace's quietest whole minute (by work): what the persistent tier is sized for."""
    whole = max(1, int(duration_s // bucket_s))
    series = demand_series(trace, profile, tpot_slo_s, whole * bucket_s, bucket_s)
    start = min(series, key=lambda point: point[1])[0]
    inside = [r for r in trace if start <= r.arrival_s < start + bucket_s]
    prompt, output = sum(r.prompt_tokens for r in inside), sum(r.output_tokens for r in inside)
    return QuietDemand(prompt / bucket_s, output / bucket_s, (prompt + output) / len(inside) if inside else 0.0)


@dataclass(frozen=True)
class StaticSizing:
    replicas: int
    attainment: float  # SLO attainment at the peak window with that many replicas
    meets_slo: bool  # False: no count reached the target (the SLO is beyond the Profile); the best is kept
    peak_start_s: float


def static_peak_replicas(
    trace: Sequence[TraceRequest],
    variant: Variant,
    config: SimConfig,
    target: float = 0.99,
    window_s: float = 60.0,
    max_replicas: int = 512,
) -> StaticSizing:
    """The fewest replicas, held fixed, that serve the trace's peak window within the SLO (`target`
    of its requests), warmed up by the window before it. Searched by simulation (doubling, then bisection)."""
    profile = variant.profile
    if profile is None:
        raise ValueError(f"sizing {variant.name!r} needs its Profile")
    peak_start, needed = peak_window(trace, profile, config.tpot_slo_s, window_s)
    window = [replace(r, arrival_s=r.arrival_s - peak_start) for r in trace if -window_s <= r.arrival_s - peak_start]
    window = [r for r in window if r.arrival_s < window_s]
    warm = [r for r in window if r.arrival_s < 0]
    inside = [r for r in window if r.arrival_s >= 0]
    quick = replace(config, tail_s=max(config.tail_s, 600.0), warmup_s=0.0, run_tail=False)
    cache: dict[int, float] = {}

    def attainment(n: int) -> float:
        if n not in cache:
            limits = ScaleLimits(min_replicas=n, max_replicas=max(n, 1))
            policy = make_policy("static-peak", StaticParams(n))
            result = simulate(inside, variant, policy, limits, config=quick, duration_s=window_s, warmup=warm)
            cache[n] = result.slo_attainment
        return cache[n]

    low = max(1, math.floor(needed / 2))  # well below the work's own replica count: surely too few
    high = low
    while attainment(high) < target and high < max_replicas:
        if high >= 4 * max(needed, 1) and attainment(high) <= attainment(high // 2) + 1e-9:
            break  # doubling no longer helps: the SLO is out of this Profile's reach
        low, high = high, min(max_replicas, high * 2)
    if attainment(high) < target:
        best = min(cache, key=lambda n: (-cache[n], n))
        return StaticSizing(best, cache[best], False, peak_start)
    while low < high:  # the fewest in (low, high] meeting the target; attainment grows with replicas
        mid = (low + high) // 2
        if attainment(mid) >= target:
            high = mid
        else:
            low = mid + 1
    return StaticSizing(high, cache[high], True, peak_start)
