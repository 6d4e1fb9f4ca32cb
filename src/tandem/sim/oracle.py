"""The clairvoyant oracle's schedule: the fewest replicas, window by window, that serve a known trace
within the SLO under the capacity model the planner uses.

Method (greedy over `window_s` windows, forward in time, on a fluid model of the fleet):
- each request costs replica-seconds at the SLO: its prompt at the Profile's prefill rate plus its
  output at the SLO batch's throughput, the batch taken from that window's own length mix
  (`slo_capacity` with the TTFT bound), so a window of long prompts costs what it really costs;
- work that arrives may wait up to the TTFT budget `delay_s` (the queueing share of the TTFT SLO): in
  window i the fleet holds the fewest replicas n_i that serve the backlog carried in plus the window's
  work (x `margin`) so that what is left over is at most `delay_s` of n_i's service:
  n_i = ceil((backlog + work) / (window_s + delay_s)), at least 1;
- `oracle_schedule(..., margin)` is searched by simulation (`tandem.sim.experiment`) for the smallest
  margin whose simulated attainment meets the target: the model's fluid bound is optimistic about
  queueing inside a replica, and the search pays exactly what the simulator's replicas need on top.

It is a lower bound only up to that model: it knows the future exactly but sizes with the same per-
replica capacity as the planner, and a different replica (or a smarter batcher) would move it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tandem.contracts import Profile
from tandem.schedule.policies import OracleParams, slo_capacity
from tandem.sim.trace import TraceRequest

__all__ = ["oracle_params", "oracle_schedule"]


def _window_work(requests: Sequence[TraceRequest], profile: Profile, tpot_s: float, delay_s: float) -> float:
    if not requests:
        return 0.0
    prompt = sum(r.prompt_tokens for r in requests)
    output = sum(r.output_tokens for r in requests)
    per_request = (prompt + output) / len(requests)
    cap = slo_capacity(profile, tpot_s, prompt / output if output else 0.0, per_request,
                       prompt_tokens=prompt / len(requests), ttft_budget_s=delay_s)  # fmt: skip
    prefill = profile.prefill_tokens_per_s
    return (prompt / prefill if prefill > 0 else 0.0) + output / cap.output_tokens_per_s


def oracle_schedule(
    trace: Sequence[TraceRequest],
    profile: Profile,
    tpot_s: float,
    delay_s: float,
    duration_s: float,
    window_s: float = 10.0,
    margin: float = 1.0,
    start_s: float = 0.0,
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """(window starts, replicas per window) from `start_s` to `duration_s` (greedy, fluid; see above)."""
    count = max(1, math.ceil((duration_s - start_s) / window_s))
    buckets: list[list[TraceRequest]] = [[] for _ in range(count)]
    for r in trace:
        i = int((r.arrival_s - start_s) // window_s)
        if 0 <= i < count:
            buckets[i].append(r)
    starts, replicas, backlog = [], [], 0.0
    for i, bucket in enumerate(buckets):
        work = _window_work(bucket, profile, tpot_s, delay_s) * margin
        total = backlog + work
        # Leftover total - n x window_s must drain within delay_s at n: total <= n x (window_s + delay_s).
        need = total / (window_s + delay_s)
        n = max(1, math.ceil(need - 1e-9))
        backlog = max(0.0, total - n * window_s)
        starts.append(start_s + i * window_s)
        replicas.append(n)
    return tuple(starts), tuple(replicas)


def oracle_params(
    trace: Sequence[TraceRequest], profile: Profile, tpot_s: float, delay_s: float, duration_s: float,
    margin: float = 1.0, tick_s: float = 2.0,
) -> OracleParams:  # fmt: skip
    """The oracle policy's parameters: its schedule (warm-up included) and a cold start + a tick of lookahead."""
    start = min((r.arrival_s for r in trace), default=0.0)
    starts, replicas = oracle_schedule(trace, profile, tpot_s, delay_s, duration_s, margin=margin,
                                       start_s=math.floor(min(start, 0.0)))  # fmt: skip
    return OracleParams(starts, replicas, profile.cold_start_s + tick_s)
