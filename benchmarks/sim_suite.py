"""The planner judged on many traffic shapes: every policy over a suite, with a tune / held-out split.

Each trace runs static-peak, capacity, the clairvoyant oracle, and hpa and kpa at several target
utilizations (their tuned-best: the cheapest setting reaching capacity's attainment, or none). Every
policy's replica-hours are reported as a ratio to the oracle's. Traces marked `tune` are the ones the
capacity policy's defaults were chosen on; the `held-out` ones were not looked at while choosing.
All traces are generated in code from seeds (tandem.sim.shapes) or read from ../shared/data, with the
admission cap on (AdmissionCap: the same router for every policy).

    .venv/bin/python benchmarks/sim_suite.py --out benchmarks/results/sim_suite_h100.json

Data: Azure LLM inference trace (conversation, 2023), CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024.
Mooncake synthetic trace, kvcache-ai/Mooncake, Apache License 2.0; Qin et al., "Mooncake", FAST 2025.
Splitwise GPU timings, MIT License, Copyright (c) 2024 Pratyush Patel.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from host import cpu_model  # benchmarks/host.py (this script's folder is on sys.path)

from tandem.contracts import Profile
from tandem.data import ATTRIBUTION, CONVERSATION_TRACE, SPLITWISE_TIMINGS
from tandem.sim.experiment import SimVariant, Slo, run_pair
from tandem.sim.shapes import (
    bimodal_lengths,
    code_completion_trace,
    diurnal_trace,
    heavy_tail_lengths,
    long_context_trace,
    varying_rate_trace,
)
from tandem.sim.simulator import SimConfig
from tandem.sim.trace import bursty_trace, compress, fit_context, load_trace

HERE = Path(__file__).resolve().parent
MOONCAKE = HERE.parent.parent / "shared" / "data" / "mooncake_synthetic_trace.jsonl"
PROFILE = HERE / "results" / "profiles" / "llama2-70b-h100.json"
MINUTES = 15.0  # each trace's window (the suite's run time scales with it)
KEYS = ("replica_hours", "mean_replicas", "peak_replicas", "slo_attainment", "ttft_p99_s", "tpot_p99_s", "lost",
        "unserved")  # fmt: skip


def conv_lengths():
    return [(r.prompt_tokens, r.output_tokens) for r in load_trace()]


def build(name: str, context: int):
    """(trace, split, description) of one suite trace."""
    d = MINUTES * 60
    if name == "conv-1x":
        return [r for r in load_trace() if r.arrival_s < d], "tune", "Azure conversation hour, first 15 min"
    if name == "conv-4x":
        return [r for r in compress(load_trace(), 4.0) if r.arrival_s < d], "held-out", "Azure conversation at 4x"
    if name == "bursty-10x10s":
        trace = bursty_trace(5.4, d, conv_lengths(), 10, 10, 12, seed=0)
        return trace, "tune", "conv lengths, 10 s bursts at 10x, 12/h"
    if name == "bursty-5x30s":
        return bursty_trace(5.4, d, conv_lengths(), 5, 30, 12, seed=3), "held-out", "30 s bursts at 5x, 12/h"
    if name == "bursty-20x5s":
        return bursty_trace(5.4, d, conv_lengths(), 20, 5, 12, seed=4), "held-out", "5 s bursts at 20x, 12/h"
    if name == "code-a":
        return code_completion_trace(d, 4.0, 10, 10, 12, seed=0), "tune", "code completion, 10 s bursts at 10x"
    if name == "code-b":
        return code_completion_trace(d, 3.0, 8, 10, 18, seed=1), "held-out", "code completion, 8x bursts, 18/h"
    if name == "long-a":
        trace, _ = fit_context(long_context_trace(d, 3.4, seed=0), context)
        return trace, "tune", "long-context conversation (4-12k prompts, fitted)"
    if name == "long-b":
        trace, _ = fit_context(long_context_trace(d, 6.0, seed=1, wobble=0.5), context)
        return trace, "held-out", "long-context conversation, 6 req/s, +-50%"
    if name == "diurnal":
        return diurnal_trace(d, 6.0, 0.8, seed=5), "held-out", "a day compressed into 15 min, +-80%"
    if name == "mooncake":
        trace, _ = fit_context(load_trace(MOONCAKE), context, quantile=0.5)
        trace = compress(trace, 1.0)
        return [r for r in trace if r.arrival_s < d], "held-out", "Mooncake synthetic (fitted at its median)"
    if name == "heavy-tail":
        trace = varying_rate_trace(lambda t: 8.0, 8.0, d, heavy_tail_lengths(), seed=6)
        return trace, "held-out", "Pareto prompts, log-normal outputs, 8 req/s"
    if name == "bimodal":
        trace = varying_rate_trace(lambda t: 6.0, 6.0, d, bimodal_lengths(), seed=7)
        return trace, "held-out", "chat + RAG mix, 6 req/s"
    raise ValueError(name)


SUITE = ("conv-1x", "bursty-10x10s", "code-a", "long-a", "conv-4x", "bursty-5x30s", "bursty-20x5s", "code-b",
         "long-b", "diurnal", "mooncake", "heavy-tail", "bimodal")  # fmt: skip


@functools.cache
def built(name: str, context: int):
    """`build`, once per worker process (a worker runs several policies on each trace)."""
    trace, split, description = build(name, context)
    return tuple(trace), split, description


def one(job):
    name, policy, utilization, slo_args, overrides = job
    profile = Profile.from_json(PROFILE.read_text())
    trace, split, _ = built(name, profile.max_model_len)
    slo = Slo(*slo_args)
    result = run_pair(trace, SimVariant("h100", profile), policy, slo, duration_s=MINUTES * 60,
                      config=SimConfig(admission_cap=True), utilization=utilization or 0.7,
                      overrides=overrides if policy == "capacity" else None)  # fmt: skip
    row = result.row()
    return {"trace": name, "split": split, "policy": policy, "utilization": utilization,
            **{k: row[k] for k in KEYS}, "setup": row["setup"], "wall_s": row["wall_s"]}  # fmt: skip


def summarize(runs, target):
    table = []
    for name in dict.fromkeys(r["trace"] for r in runs):
        rows = [r for r in runs if r["trace"] == name]
        pick = {p: next(r for r in rows if r["policy"] == p) for p in ("capacity", "oracle", "static-peak")}
        bar = max(pick["capacity"]["slo_attainment"], target)
        for p in ("hpa", "kpa"):
            ok = [r for r in rows if r["policy"] == p and r["slo_attainment"] >= bar]
            best = min(ok, key=lambda r: r["replica_hours"], default=None)
            pick[p] = best or max((r for r in rows if r["policy"] == p), key=lambda r: r["slo_attainment"])
            pick[p] = {**pick[p], "reaches_bar": best is not None}
        oracle = pick["oracle"]["replica_hours"]
        for p, r in pick.items():
            table.append({"trace": name, "split": rows[0]["split"], "policy": p, "utilization": r["utilization"],
                          "replica_hours": r["replica_hours"], "slo_attainment": r["slo_attainment"],
                          "lost": r["lost"], "ratio_to_oracle": r["replica_hours"] / oracle if oracle else None,
                          "reaches_bar": r.get("reaches_bar", True)})  # fmt: skip
    return table


def markdown(table):
    lines = ["| trace | split | policy | replica-hours | attainment | x oracle |", "|---|---|---|---|---|---|"]
    for t in table:
        label = t["policy"] + (f" (u={t['utilization']})" if t["utilization"] else "")
        if t["policy"] in ("hpa", "kpa") and not t["reaches_bar"]:
            label += " (none reaches capacity's attainment: best shown)"
        lines.append(f"| {t['trace']} | {t['split']} | {label} | {t['replica_hours']:.2f} | "
                     f"{t['slo_attainment']:.2%} | {t['ratio_to_oracle']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slo-ttft-s", type=float, default=5.0)
    parser.add_argument("--slo-tpot-s", type=float, default=0.1)
    parser.add_argument("--target", type=float, default=0.99)
    parser.add_argument("--utilizations", default="0.3,0.5,0.7")
    parser.add_argument("--traces", default=",".join(SUITE))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--capacity-params", default="{}", help="JSON: capacity parameters to change")
    parser.add_argument("--policies", default="oracle,capacity,static-peak,hpa,kpa", help="the policies to simulate")
    parser.add_argument(
        "--reuse",
        type=Path,
        help="a previous result (same traces, SLO, minutes): the runs of the "
        "policies not simulated now are taken from it (for a change to one policy alone)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    slo_args = (args.slo_ttft_s, args.slo_tpot_s, args.target)
    overrides = json.loads(args.capacity_params)
    policies = args.policies.split(",")
    jobs, traces = [], args.traces.split(",")
    for name in traces:
        jobs += [(name, p, None, slo_args, overrides) for p in ("oracle", "capacity", "static-peak") if p in policies]
        jobs += [(name, p, float(u), slo_args, None) for p in ("hpa", "kpa") if p in policies
                 for u in args.utilizations.split(",")]  # fmt: skip
    reused = []
    if args.reuse is not None:
        before = json.loads(args.reuse.read_text())
        if before["slo"] != {"ttft_s": slo_args[0], "tpot_s": slo_args[1], "target": slo_args[2]} or (
            before["minutes_per_trace"] != MINUTES
        ):
            parser.error(f"{args.reuse} was made with another SLO or trace length")
        reused = [r for r in before["runs"] if r["policy"] not in policies and r["trace"] in traces]
    started = time.perf_counter()
    # The jobs that simulate several times (the oracle's margin search, static-peak's sizing) first, so the workers
    # end on short ones and finish together; the runs are kept in the jobs' order.
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][1] not in ("oracle", "static-peak"))
    with ProcessPoolExecutor(args.workers) as pool:
        done = dict(zip(order, pool.map(one, [jobs[i] for i in order]), strict=True))
    runs = [done[i] for i in range(len(jobs))]
    runs = sorted(runs + reused, key=lambda r: traces.index(r["trace"]))  # each trace's runs together, in order
    wall = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = children.ru_utime + children.ru_stime  # the workers' CPU seconds: what an idle machine would take
    table = summarize(runs, args.target)
    payload = {
        "command": shlex.join([".venv/bin/python", *sys.argv]),
        "host_cpu": cpu_model(),
        "load": Path("/proc/loadavg").read_text().split()[:3],
        "wall_s": wall,
        "cpu_s": cpu,
        "workers": args.workers,
        "simulated": len(jobs),
        "reused_from": str(args.reuse) if args.reuse is not None else None,
        "reused_runs": len(reused),
        "minutes_per_trace": MINUTES,
        "capacity_params": overrides,
        "slo": {"ttft_s": args.slo_ttft_s, "tpot_s": args.slo_tpot_s, "target": args.target},
        "splits": {s: sorted({r["trace"] for r in runs if r["split"] == s}) for s in ("tune", "held-out")},
        "table": table,
        "runs": runs,
        "attribution": [ATTRIBUTION[CONVERSATION_TRACE], ATTRIBUTION[SPLITWISE_TIMINGS],
                        "Mooncake synthetic trace, kvcache-ai/Mooncake, Apache License 2.0; Qin et al., FAST 2025"],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(table) + "\n")
    print(markdown(table))
    print(f"{len(jobs)} simulations in {wall:.0f} s ({args.workers} workers, {cpu:.0f} CPU s)", file=sys.stderr)


if __name__ == "__main__":
    main()
