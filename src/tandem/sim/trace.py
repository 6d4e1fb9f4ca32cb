"""Request traces for the simulator: the Azure LLM inference trace, or synthetic Poisson arrivals.

The bundled data (../shared/data/azure_llm_conv_2023.csv: TIMESTAMP,ContextTokens,GeneratedTokens)
is one hour of real conversation traffic, CC-BY 4.0, from Patel et al., "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024 (Azure/AzurePublicDataset).
"""

from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

__all__ = ["TraceRequest", "default_trace_path", "load_trace", "poisson_trace", "compress"]

TRACE_FILE = "azure_llm_conv_2023.csv"


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # seconds since the trace's first request
    prompt_tokens: int
    output_tokens: int


def default_trace_path() -> Path:
    """$TANDEM_DATA_DIR/azure_llm_conv_2023.csv, else ../shared/data beside the repository."""
    data_dir = os.environ.get("TANDEM_DATA_DIR")
    if data_dir:
        return Path(data_dir) / TRACE_FILE
    return Path(__file__).resolve().parents[3].parent / "shared" / "data" / TRACE_FILE


def load_trace(
    path: str | Path | None = None, start_s: float = 0.0, duration_s: float | None = None
) -> list[TraceRequest]:
    """The requests arriving in [start_s, start_s + duration_s) of the trace, re-timed from 0."""
    path = Path(path) if path is not None else default_trace_path()
    requests, first = [], None
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            stamp = datetime.fromisoformat(row["TIMESTAMP"]).timestamp()
            first = stamp if first is None else first
            at = stamp - first
            if at < start_s or (duration_s is not None and at >= start_s + duration_s):
                continue
            requests.append(TraceRequest(at - start_s, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    requests.sort(key=lambda r: r.arrival_s)
    return requests


def poisson_trace(rate_per_s: float, duration_s: float, prompt: int, output: int, seed: int = 0, start_s: float = 0.0):
    """Poisson arrivals of identical requests (for bursts and controlled experiments)."""
    rng, t, out = random.Random(seed), start_s, []
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= start_s + duration_s:
            return out
        out.append(TraceRequest(t, prompt, output))


def compress(trace: list[TraceRequest], factor: float) -> list[TraceRequest]:
    """The same requests `factor` times as fast (factor 2: twice the request rate)."""
    return [replace(r, arrival_s=r.arrival_s / factor) for r in trace]
