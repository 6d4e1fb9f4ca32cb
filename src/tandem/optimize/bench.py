"""`tandem bench`: one workload through each recipe and through transformers, in the same run.

Every row serves the same requests (lengths from the Azure trace, held-out code as prompts), all
arriving at t=0, greedy, exactly max_tokens each. Rows report output tokens/s, TTFT and TPOT
percentiles, and cost per million output tokens at the given $/hour, each with its ratio to
`baseline`. Times are wall-clock on this machine: compare ratios, not absolute values.

Each row runs in its own process (as a replica does), built and warmed up first; then the
workload runs in `repeats` rounds, every row once per round, and each row reports its fastest run
(by wall time), as `timeit` does: other processes only ever slow a run down. On this shared
machine slow spells outlast one row's runs (two runs of the same bench, rows one after another,
gave the best recipe 1.59x and 1.29x baseline); rounds spread them over all rows
(tandem.optimize.bench_workers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tandem.model.loader import load_model
from tandem.optimize.bench_workers import RowSpec, Timings, run_rounds
from tandem.pricing import DEFAULT_PRICE, usd_per_million_tokens
from tandem.workload import load_workload

__all__ = ["BenchRow", "run_bench", "rows_as_json", "summarize", "usd_per_million_tokens", "DEFAULT_PRICE"]


@dataclass(frozen=True)
class BenchRow:
    recipe: str
    output_tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    usd_per_million_tokens: float
    requests: int
    output_tokens: int
    wall_s: float
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None


def summarize(recipe: str, timings: list[tuple[float, float, float, int]], usd_per_hour: float, **extra) -> BenchRow:
    """timings: (arrival, first token, finish, output tokens) per request."""
    arrival = min(t[0] for t in timings)
    wall = max(t[2] for t in timings) - arrival
    tokens = sum(t[3] for t in timings)
    ttft = np.array([t[1] - t[0] for t in timings])
    tpot = np.array([(t[2] - t[1]) / (t[3] - 1) for t in timings if t[3] > 1])
    rate = tokens / wall
    return BenchRow(
        recipe=recipe,
        output_tokens_per_s=rate,
        ttft_p50_s=float(np.percentile(ttft, 50)),
        ttft_p99_s=float(np.percentile(ttft, 99)),
        tpot_p50_s=float(np.percentile(tpot, 50)) if len(tpot) else 0.0,
        tpot_p99_s=float(np.percentile(tpot, 99)) if len(tpot) else 0.0,
        usd_per_million_tokens=usd_per_million_tokens(usd_per_hour, rate),
        requests=len(timings),
        output_tokens=tokens,
        wall_s=wall,
        **extra,
    )


def _fastest_run(runs: list[Timings]) -> Timings:
    """The run with the shortest wall time."""
    return min(runs, key=lambda run: max(t[2] for t in run) - min(t[0] for t in run))


def run_bench(
    model_dir: str | Path | None,
    recipes: list[str],
    num_requests: int,
    usd_per_hour: float,
    max_num_seqs: int = 32,
    hf_rows: bool = True,
    hf_batch_size: int = 8,
    seed: int = 0,
    progress=None,
    repeats: int = 3,
    trace: str | Path | None = None,
) -> list[BenchRow]:
    """`trace`: a CSV of request lengths (ContextTokens,GeneratedTokens); default the bundled one."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")

    # Fail here, with the loader's own message, before any worker starts.
    probe = load_model(model_dir)
    trace = None if trace is None else Path(trace)
    load_workload(probe.tokenizer, min(probe.config.max_position_embeddings, 2048), num_requests, seed, trace)
    del probe
    names = list(recipes) + (["hf-sequential", "hf-static-batch"] if hf_rows else [])
    directory = None if model_dir is None else str(model_dir)
    specs = [
        RowSpec(name, directory, max_num_seqs, num_requests, seed, hf_batch_size, None if trace is None else str(trace))
        for name in names
    ]
    rows = []
    for stats, runs in run_rounds(specs, repeats, progress):
        recipe = stats.pop("recipe")
        rows.append(summarize(recipe, _fastest_run(runs), usd_per_hour, **stats))
    return rows


def rows_as_json(rows: list[BenchRow], baseline: str = "baseline") -> list[dict]:
    base = next((r for r in rows if r.recipe == baseline), None)
    out = []
    for row in rows:
        item = asdict(row)
        if base is not None:
            item["throughput_vs_baseline"] = row.output_tokens_per_s / base.output_tokens_per_s
            item["cost_vs_baseline"] = row.usd_per_million_tokens / base.usd_per_million_tokens
        out.append(item)
    return out
