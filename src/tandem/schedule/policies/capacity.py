"""`capacity`: tandem's own policy. Replicas = predicted work / what one replica serves within the SLO.

- Capacity comes from the variant's Profile (measured by the optimization layer): the batch with
  the most decode throughput whose sequences still keep the TPOT SLO with the traffic's prompts
  prefilled beside them, and within the KV budget (`slo.slo_capacity`). A faster optimizer has a
  larger capacity, so the same traffic needs fewer replicas; the scheduler does not change a line.
- Work is counted in replicas kept busy: prompt tokens/s over the prefill rate plus output
  tokens/s over that capacity. It is the largest of three readings of the gateway's counts: the
  arrivals (the growth of in-flight requests plus the completions, times the tokens per request
  seen so far), what was served, and what the in-flight sequences need at the SLO pace (in-flight
  x 1 / tpot; served tokens saturate at capacity, so without it a queue would never show up).
- Forecast (with `ttft_slo_s`): the Theil-Sen line of the last two minutes' arriving work (a burst of a
  few seconds moves neither its level nor its slope), its value now plus its rise over the cold start:
  what is started now serves the demand of then. A fall is not projected (replicas stop at once, so the
  fleet shrinks when demand has fallen, never ahead of it). Without a TTFT SLO: Holt's linear smoothing.
- Per phase, on the live length mix: the capacity at the SLO (`slo.slo_capacity`) is the decode batch
  whose TPOT holds with the observed prompts prefilled beside it, and (with `ttft_slo_s`) whose
  prompt tokens/s still queue and prefill within the TTFT budget; the mix (prompt and output tokens
  per request) is smoothed from what the gateway sees now, never fixed.
- Headroom (with `ttft_slo_s`): what the forecast misses (a burst it cannot see coming, a step it is slow
  to follow, the noise of the rate served now) is held as room: a work-weighted quantile, over the last
  `burst_memory_s`, of each recent shortfall (the work of the last 10 s doubling up to ~80 s against what the
  forecasts made a cold start before had sized the fleet for) once a queue absorbs its share of the TTFT
  SLO (`headroom.shortfall_need`, `headroom.headroom`); the observed SLO attainment (when the gateway
  reports it) corrects that headroom slowly (`headroom.feedback`).
- Queueing (with `ttft_slo_s`): requests are discrete and hold a slot each, so the fleet is an M/G/c
  queue of replicas x batch slots; square-root staffing adds `staffing_beta` x sqrt(busy slots).
- Arrivals: counted as they come when the gateway counts them (`TokenDemand.arrived_*`), else
  estimated by flow conservation (below).
- Scale-down is stabilized (the highest recommendation of the last 60 s); scale-up is immediate.
- A persistent minimum tier: the replicas needed for `min_tier_*` demand are always kept, however
  quiet it gets (so a faster optimizer shrinks the always-on tier too).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from tandem.contracts import Profile
from tandem.schedule.policies.context import PolicyState, ScaleContext, apply_limits, trim_window
from tandem.schedule.policies.forecast import holt, robust_line
from tandem.schedule.policies.headroom import (
    FeedbackGains,
    attainment_window,
    feedback,
    headroom,
    peak_windows,
    shortfall_need,
)
from tandem.schedule.policies.hpa import stabilize
from tandem.schedule.policies.slo import SloCapacity, slo_capacity

# A Theil-Sen line follows a step once the step covers ~29% of its window (its breakdown point).
_FIT_LAG = 0.3

__all__ = ["CapacityParams", "SloCapacity", "capacity", "slo_capacity", "tier_replicas"]


@dataclass(frozen=True)
class CapacityParams:
    tpot_slo_s: float = 0.1  # time per output token each sequence must keep (10 tokens/s)
    tpot_margin: float = 1.0  # plan batches for this share of the TPOT SLO (the batch varies around the plan)
    ttft_slo_s: float | None = None  # time to first token; None: no burst headroom
    queue_share: float = 0.75  # the share of the TTFT SLO a request may spend queued (the rest: its prefill)
    burst_memory_s: float = 1800.0  # how far back the peaks the headroom is a quantile of reach
    headroom_quantile: float = 0.99  # of the peaks' needs, weighted by their work (the share of requests kept)
    peak_window_s: float = 10.0  # the shortest window a shortfall is measured over (the gateway's demand window) ...
    tick_window_s: float = 2.0  # ... or, where the gateway's arrival counters are fed, this (the controller's tick)
    mean_window_s: float = 60.0  # the median of this long is what the notes call "observed"
    feedback: FeedbackGains | None = FeedbackGains()  # attainment feedback on the headroom (None: off)
    chunk_tokens: int = 512  # prompt tokens per engine iteration (chunked prefill), for the TTFT bound
    staffing_beta: float = 1.0  # square-root staffing: beta x sqrt(slots busy) slots more (with ttft_slo_s)
    queue_demand: bool = False  # a gateway queue that outlives the TTFT queueing budget grows the fleet (experiment)
    paced_room: bool = False  # the room's prompt work at the gateway's pace, not the prefill rate (experiment)
    target_utilization: float = 1.0  # plan replicas busy at most this fraction of their capacity
    level_time_s: float = 20.0  # Holt level: time constant of its smoothing (0: none)
    trend_time_s: float = 120.0  # Holt trend: time constant (longer than a cold start: ramps, not noise)
    fit_window_s: float = 120.0  # with ttft_slo_s: the robust line (level now + rise) is fitted over this long
    horizon_s: float | None = None  # forecast horizon; None: the profile's cold start
    scale_down_stabilization_s: float = 60.0
    min_tier_tokens_per_s: float = 0.0  # output demand the persistent tier is sized for
    min_tier_prompt_tokens_per_s: float = 0.0  # ... and its prompt demand (prefill time)
    min_tier_tokens_per_sequence: float = 0.0  # ... and its tokens per request (KV memory)
    mix_smoothing: float = 0.05  # EWMA weight of each tick's token mix (prompt/output, per request)
    arrival_time_s: float = 2.0  # time constant of the arrival rate's smoothing (0: none)

    def __post_init__(self) -> None:
        if isinstance(self.feedback, dict):  # from a deployment file: `feedback: {target: 0.995, ...}`
            object.__setattr__(self, "feedback", FeedbackGains(**self.feedback))
        if self.tpot_slo_s <= 0 or not 0 < self.target_utilization <= 1 or not 0 < self.tpot_margin <= 1:
            raise ValueError("capacity needs tpot_slo_s > 0, target_utilization and tpot_margin in (0, 1]")
        if self.level_time_s < 0 or self.trend_time_s < 0 or not 0 < self.mix_smoothing <= 1:
            raise ValueError("capacity needs level_time_s, trend_time_s >= 0 and mix_smoothing in (0, 1]")
        if self.ttft_slo_s is not None and (self.ttft_slo_s <= 0 or not 0 < self.queue_share <= 1):
            raise ValueError("capacity needs ttft_slo_s > 0 and queue_share in (0, 1]")
        if not 0 < self.headroom_quantile <= 1 or min(self.peak_window_s, self.tick_window_s, self.mean_window_s) <= 0:
            raise ValueError("capacity needs headroom_quantile in (0, 1] and positive peak and mean windows")


def _work(profile: Profile, cap: SloCapacity, output_tokens_per_s: float, prompt_tokens_per_s: float) -> float:
    """Replicas kept fully busy: decode at the SLO's capacity plus prefill at the measured rate."""
    busy = output_tokens_per_s / cap.output_tokens_per_s if cap.output_tokens_per_s > 0 else math.inf
    if profile.prefill_tokens_per_s > 0:
        busy += prompt_tokens_per_s / profile.prefill_tokens_per_s
    return busy


def _paced_cost(profile: Profile, cap: SloCapacity, tpot_slo_s: float, prompt_per_s: float, work: float) -> float:
    """How much dearer the work is when its prompts are prefilled at the gateway's pace (a replica at the SLO
    batch is sent prompts at (T - d(n*)) / T of its prefill rate, `prefill_budget`), not its full prefill rate:
    a burst's surplus is absorbed at the pace. 1 without prompts or a prefill rate."""
    rate = profile.prefill_tokens_per_s
    if rate <= 0 or work <= 0 or not math.isfinite(work) or cap.output_tokens_per_s <= 0:
        return 1.0
    decode_s = cap.batch / cap.output_tokens_per_s
    share = max(0.0, 1.0 - decode_s / tpot_slo_s)  # of the prefill rate, at the pace
    prompt = min(prompt_per_s / rate, work)  # replicas busy prefilling
    if share <= 0:
        return 1.0
    return (work - prompt + prompt / share) / work


def _replicas(busy: float, params: CapacityParams, fallback: int) -> int:
    return math.ceil(busy / params.target_utilization - 1e-9) if math.isfinite(busy) else fallback


def tier_replicas(profile: Profile, params: CapacityParams) -> int:
    """The persistent minimum tier: replicas for the tier's demand at the SLO."""
    out, prompt = params.min_tier_tokens_per_s, params.min_tier_prompt_tokens_per_s
    if not (out or prompt):
        return 0
    mix = prompt / out if out > 0 else 0.0
    cap = slo_capacity(profile, params.tpot_slo_s * params.tpot_margin, mix, params.min_tier_tokens_per_sequence)
    return _replicas(_work(profile, cap, out, prompt), params, 0)


def _ewma(old: float | None, sample: float, weight: float) -> float:
    return sample if old is None else weight * sample + (1 - weight) * old


def capacity(ctx: ScaleContext, params: CapacityParams = CapacityParams()) -> tuple[int, PolicyState]:
    profile = ctx.profile
    if profile is None:
        raise ValueError(f"the capacity policy needs the measured Profile of variant {ctx.variant!r}")
    demand, state, weight = ctx.demand, ctx.state, params.mix_smoothing
    mix, seq_tokens, out_per_request = state.mix, state.seq_tokens, state.out_per_request
    if demand.output_tokens_per_s > 0:
        mix = _ewma(mix, demand.prompt_tokens_per_s / demand.output_tokens_per_s, weight)
    if demand.requests_per_s > 0:
        per_request = (demand.prompt_tokens_per_s + demand.output_tokens_per_s) / demand.requests_per_s
        seq_tokens = _ewma(seq_tokens, per_request, weight)
        if demand.output_tokens_per_s > 0:
            out_per_request = _ewma(out_per_request, demand.output_tokens_per_s / demand.requests_per_s, weight)
    prompt_per_request = max((seq_tokens or 0.0) - (out_per_request or 0.0), 0.0)
    delay = params.queue_share * params.ttft_slo_s if params.ttft_slo_s is not None else None
    cap = slo_capacity(
        profile,
        params.tpot_slo_s * params.tpot_margin,
        mix or 0.0,
        seq_tokens or 0.0,
        prompt_tokens=prompt_per_request,
        ttft_budget_s=delay,
        chunk_tokens=params.chunk_tokens,
    )

    # Arrivals, by flow conservation: the growth of what is in flight plus what finished since the last
    # tick. The gateway counts a request's tokens when it finishes, which lags a burst and is capped by
    # what the fleet can serve; the in-flight count moves the moment requests arrive.
    arrivals = state.arrivals
    dt = ctx.now - state.updated_at if state.updated_at is not None else 0.0
    if demand.arrived_requests_per_s is not None:
        arrivals = demand.arrived_requests_per_s  # counted as they came (over the demand window)
    elif state.in_flight is not None and dt > 0:
        sample = max(0.0, (ctx.in_flight - state.in_flight) / dt + demand.requests_per_s)
        weight = 1.0 - math.exp(-dt / params.arrival_time_s) if params.arrival_time_s > 0 else 1.0
        arrivals = sample if arrivals is None else weight * sample + (1 - weight) * arrivals
    arrivals = demand.requests_per_s if arrivals is None else arrivals
    prompt = demand.prompt_tokens_per_s
    arriving_prompt = demand.arrived_prompt_tokens_per_s
    if arriving_prompt is None:
        arriving_prompt = arrivals * prompt_per_request
    arriving = _work(profile, cap, arrivals * (out_per_request or 0.0), arriving_prompt)
    # The work that arrived since the last tick, from the gateway's arrival counters: a burst of 5 s is half
    # of a 10 s demand window, and the room it needs is the 5 s peak's (the shortfall's shortest window).
    totals, ticks, tick_work = state.arrived_totals, state.ticks, None
    if demand.arrived_requests_total is not None and demand.arrived_prompt_tokens_total is not None:
        if totals is not None and dt > 0:
            requests = max(demand.arrived_requests_total - totals[0], 0) / dt
            prompts = max(demand.arrived_prompt_tokens_total - totals[1], 0) / dt
            tick_work = _work(profile, cap, requests * (out_per_request or 0.0), prompts)
        totals = (demand.arrived_requests_total, demand.arrived_prompt_tokens_total)
    held = ctx.in_flight if delay is None else ctx.in_flight - ctx.buffered  # with headroom: on replicas only
    backlog = _work(profile, cap, max(demand.output_tokens_per_s, held / params.tpot_slo_s), prompt)
    observed = max(arriving, backlog)
    horizon = profile.cold_start_s if params.horizon_s is None else params.horizon_s
    samples, peaks, gain, attained = state.samples, state.peaks, state.gain, state.attained
    room = 1.0 if delay is None else 0.0  # no TTFT SLO: none (x 1); with one: replicas beyond the forecast
    forecasts = state.forecasts
    if delay is not None and math.isfinite(arriving):
        # The work now and its rise, from the Theil-Sen line of the last `fit_window_s` (a burst of a few
        # seconds moves neither; a minute's median would lag a ramp by half a minute). A rise is projected
        # over the cold start (what is started now serves the demand of then); a fall is not: replicas stop
        # at once, so the fleet shrinks when the demand has fallen, never ahead of it.
        shortest = params.peak_window_s if tick_work is None else params.tick_window_s
        windows = peak_windows(shortest, horizon + _FIT_LAG * params.fit_window_s)
        memory = max(params.mean_window_s + params.peak_window_s, params.fit_window_s, windows[-1])
        samples = (*trim_window(samples, ctx.now, memory), (ctx.now, arriving))
        if tick_work is not None and math.isfinite(tick_work):
            ticks = (*trim_window(ticks, ctx.now, windows[-1] + 2 * dt), (ctx.now, tick_work))
        else:
            ticks = ()
        fit = tuple((t, v) for t, v in samples if t > ctx.now - params.fit_window_s)
        level, trend = robust_line(fit, ctx.now)
        ahead = max(level + max(trend, 0.0) * horizon, 0.0)
        # A forecast is judged only when it had a whole window of traffic to go on: a start from nothing is a
        # step no ratio describes (the line follows it), not a shortfall to hold room for all the next hour.
        judged = ahead if fit[0][0] <= ctx.now - 0.9 * params.fit_window_s and min(v for _, v in fit) > 0 else math.nan
        # The headroom: a quantile of what the forecasts missed (`headroom.shortfall_need`), each shortfall of
        # the last w seconds (10 s doubling up to the cold start + the line's lag) against the forecasts that
        # sized the fleet for them; weighted by the work that came.
        if ticks:  # per tick: each sample covers the tick before it
            need = shortfall_need(ticks, state.forecasts, ctx.now, horizon, windows, delay, dt)
        else:
            need = shortfall_need(samples, state.forecasts, ctx.now, horizon, windows, delay, params.peak_window_s)
        peaks = trim_window(peaks, ctx.now, params.burst_memory_s)  # older ones go even while none is judged
        if need is not None and params.paced_room:
            need *= _paced_cost(profile, cap, params.tpot_slo_s, arriving_prompt, arriving)
        if need is not None:
            peaks = (*peaks, (ctx.now, need, arriving))
        forecasts = (*trim_window(state.forecasts, ctx.now, horizon + windows[-1] + 2 * max(dt, 1.0)),
                     (ctx.now, judged))  # fmt: skip
        room = headroom(peaks, params.headroom_quantile, least=0.0)  # replicas beyond the forecast
        if params.feedback is not None:
            attained = attainment_window(attained, demand.slo_attainment, demand.requests_per_s, dt,
                                         params.feedback)  # fmt: skip
            share = attained[0] / attained[1] if attained[1] > 0 else None
            starting = ctx.ready_replicas < ctx.current_replicas
            blind = any(math.isnan(f) for _, f in forecasts)  # the last few minutes' forecasts had no traffic to go on
            if share is not None and share < params.feedback.target and (starting or blind):
                share = None  # misses while replicas start, or after a start from nothing, are not the headroom's
            gain = feedback(gain, share, dt, params.feedback)
        observed = statistics.median(v for t, v in samples if t > ctx.now - params.mean_window_s)
    else:
        level, trend = holt(state.level, state.trend, state.updated_at, observed, ctx.now, params.level_time_s,
                            params.trend_time_s)  # fmt: skip
        ahead = max(level + trend * horizon, 0.0)
    # The forecast with its headroom, never below the backlog. Requests come one by one and hold a slot for a
    # while, so a fleet of W replicas' work (W x batch slots busy) is an M/G/c queue: square-root staffing
    # (Halfin-Whitt) keeps its waiting rare with beta x sqrt(W x batch) slots more: beta x sqrt(W / batch)
    # replicas.
    if delay is not None:
        ahead += params.staffing_beta * math.sqrt(ahead / max(cap.batch, 1))
        # What is in flight already is served by the replicas it is on; a replica started for it would come a
        # cold start too late. It keeps the fleet from shrinking under it, it does not grow it.
        backlog = min(backlog, float(ctx.current_replicas))
    predicted = max(backlog, (ahead * room if delay is None else ahead + room) * gain, 0.0)
    queued_since = state.queued_since
    if ctx.buffered <= 0:
        queued_since = None
    elif queued_since is None:
        queued_since = ctx.now
    if params.queue_demand and delay is not None and queued_since is not None and ctx.now - queued_since > delay:
        # A queue older than the TTFT budget is not a burst draining: its work, spread over a cold start, is demand.
        per_request = _work(profile, cap, out_per_request or 0.0, prompt_per_request)
        if math.isfinite(per_request):
            predicted += ctx.buffered * per_request / max(horizon, 1.0)

    tier = tier_replicas(profile, params)
    raw = max(_replicas(predicted, params, ctx.limits.max_replicas), tier)
    window = params.scale_down_stabilization_s
    history = tuple((t, r) for t, r in state.recommendations if t > ctx.now - window)
    stable = stabilize(raw, ctx.current_replicas, history, ctx.now, 0.0, window)
    state = replace(
        state,
        recommendations=(*history, (ctx.now, raw)),
        samples=samples,
        arrived_totals=totals,
        ticks=ticks,
        peaks=peaks,
        forecasts=forecasts,
        gain=gain,
        attained=attained,
        queued_since=queued_since,
        level=level,
        trend=trend,
        updated_at=ctx.now,
        mix=mix,
        seq_tokens=seq_tokens,
        out_per_request=out_per_request,
        in_flight=ctx.in_flight,
        arrivals=arrivals,
        notes=(
            ("arriving", arriving),
            ("observed", observed),
            ("predicted", predicted),
            ("batch", cap.batch),
            ("capacity", cap.output_tokens_per_s),
            ("headroom", room),
            ("gain", gain),
        ),
    )
    return apply_limits(max(stable, tier), ctx, state)
