"""Request traces for the simulator: the bundled Azure conversation trace, any CSV of its columns, or
synthetic arrivals (Poisson, and bursty traffic shaped like production code completion).

The bundled trace (tandem/data/azure_llm_conv_2023.csv: TIMESTAMP,ContextTokens,GeneratedTokens) is
one hour of real conversation traffic: Azure LLM inference trace 2023, Azure/AzurePublicDataset,
CC-BY 4.0; Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from tandem.data import CONVERSATION_TRACE, data_path
from tandem.data.traces import TIMED_COLUMNS as COLUMNS
from tandem.data.traces import read_trace
from tandem.sim.block_trace import read_block_ids

__all__ = [
    "TraceRequest",
    "bursty_trace",
    "compress",
    "default_trace_path",
    "fit_context",
    "load_trace",
    "poisson_trace",
    "trace_path",
]


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # seconds since the trace's first request
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()  # the prompt's prefix block ids (Mooncake's hash_ids), when the trace has them
    tenant_class: str | None = None  # --tenant-mix's class (tandem.sim.tenant_mix)
    priority: int = 0  # higher first at the gateway's buffer


def default_trace_path() -> Path:
    """The bundled conversation trace (package data)."""
    return data_path(CONVERSATION_TRACE)


def trace_path(name: str) -> Path:
    """`conv` (the bundled trace), a CSV path or a Mooncake `.jsonl` path."""
    if name == "conv":
        return default_trace_path()
    path = Path(name)
    if not path.is_file():
        raise ValueError(
            f"{name}: no such trace file (give 'conv', a CSV with columns {','.join(COLUMNS)}, "
            "or a Mooncake JSON-lines trace, .jsonl)"
        )
    return path


def load_trace(
    path: str | Path | None = None, start_s: float = 0.0, duration_s: float | None = None
) -> list[TraceRequest]:
    """The requests arriving in [start_s, start_s + duration_s) of the trace, re-timed from 0.

    TIMESTAMP is ISO 8601 (as the Azure traces have it) or seconds; rows may come in any order.
    """
    path = path if path is not None else default_trace_path()
    raw = read_trace(path)
    blocks = read_block_ids(path) if Path(path).suffix == ".jsonl" else [()] * len(raw)
    # An answer has at least one token.
    rows = sorted(((t, p, max(o, 1), b) for (t, p, o), b in zip(raw, blocks, strict=True)), key=lambda row: row[:3])
    first = rows[0][0]
    end = math.inf if duration_s is None else start_s + duration_s
    return [TraceRequest(t - first - start_s, p, o, b) for t, p, o, b in rows if start_s <= t - first < end]


def poisson_trace(rate_per_s: float, duration_s: float, prompt: int, output: int, seed: int = 0, start_s: float = 0.0):
    """Poisson arrivals of identical requests (for bursts and controlled experiments)."""
    rng, t, out = random.Random(seed), start_s, []
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= start_s + duration_s:
            return out
        out.append(TraceRequest(t, prompt, output))


def bursty_trace(
    mean_rate_per_s: float,
    duration_s: float,
    lengths: list[tuple[int, int]],
    burst_factor: float = 10.0,
    burst_s: float = 10.0,
    bursts_per_hour: float = 12.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Poisson traffic with bursts: `burst_s`-long spells at `burst_factor` x the mean rate, at random
    times (`bursts_per_hour` on average, never overlapping), the rest at a base rate that keeps the
    overall mean at `mean_rate_per_s`. Production code-completion traffic looks like this: 10-second
    bursts an order of magnitude over its mean. (prompt, output) lengths are drawn from `lengths`.
    """
    if not lengths or mean_rate_per_s <= 0 or duration_s <= 0 or burst_factor < 1 or burst_s <= 0:
        raise ValueError("bursty_trace needs lengths, a positive rate and duration, burst_factor >= 1, burst_s > 0")
    rng = random.Random(seed)
    count = max(0, round(bursts_per_hour * duration_s / 3600.0))
    slots = int(duration_s // burst_s)
    if count > slots // 2:
        raise ValueError(f"{count} bursts of {burst_s:g} s do not fit apart in {duration_s:g} s")
    starts = sorted(s * burst_s for s in rng.sample(range(1, slots, 2), count)) if count else []
    burst_time = count * burst_s
    base = mean_rate_per_s * (duration_s - burst_factor * burst_time) / (duration_s - burst_time)
    if base < 0:
        raise ValueError("the bursts alone exceed the mean rate; lower burst_factor or bursts_per_hour")
    out, t = [], 0.0
    while True:
        in_burst = any(s <= t < s + burst_s for s in starts)
        rate = mean_rate_per_s * burst_factor if in_burst else base
        step = rng.expovariate(rate) if rate > 0 else math.inf
        boundary = min((b for s in starts for b in (s, s + burst_s) if b > t), default=duration_s)
        if t + step >= boundary:  # the rate changes first: restart from there (memoryless)
            t = boundary
            if t >= duration_s:
                return out
            continue
        t += step
        prompt, output = lengths[rng.randrange(len(lengths))]
        out.append(TraceRequest(t, prompt, output))


def compress(trace: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """The same requests `factor` times as fast (factor 2: twice the request rate, half the time)."""
    if factor <= 0:
        raise ValueError(f"the rate scale must be > 0 (got {factor})")
    return [replace(r, arrival_s=r.arrival_s / factor) for r in trace]


def fit_context(trace: list[TraceRequest], max_model_len: int, quantile: float = 0.99) -> tuple[list, float]:
    """Scale every request's lengths by one factor so the trace's `quantile` request fits the context
    (what `tandem bench` does); longer ones are clipped. Returns (trace, factor); factor 1 if all fit."""
    totals = sorted(r.prompt_tokens + r.output_tokens for r in trace)
    if not totals:
        return list(trace), 1.0
    top = totals[min(int(quantile * len(totals)), len(totals) - 1)]
    factor = min(1.0, (max_model_len - 1) / top) if top else 1.0
    out = []
    for r in trace:
        output = max(1, min(round(r.output_tokens * factor), max_model_len - 2))
        prompt = max(1, min(round(r.prompt_tokens * factor), max_model_len - 1 - output))
        out.append(TraceRequest(r.arrival_s, prompt, output))
    return out, factor
