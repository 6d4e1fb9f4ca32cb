"""Policies compared at equal SLO attainment: static-peak, hpa, kpa and capacity on one variant.

`tandem sim` runs hpa and kpa at one target utilization (Knative's default 0.7). A fair comparison
gives the reactive policies every chance: here each runs at several target utilizations, and
capacity (its defaults) is compared with the cheapest hpa and kpa setting that reaches at least its
SLO attainment (and at least --target). Static-peak is sized at the trace's peak minute.

    .venv/bin/python benchmarks/sim_policies.py --profile P.json --name h100 --trace conv \\
        --slo-ttft-s 2.5 --slo-tpot-s 0.15 --out benchmarks/results/sim_policies_conv.json

Data: Azure LLM inference trace (conversation, 2023), CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024.
Splitwise GPU timings, MIT License, Copyright (c) 2024 Pratyush Patel (when the Profile is imported).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from tandem.contracts import Profile
from tandem.data import ATTRIBUTION, CONVERSATION_TRACE
from tandem.sim.experiment import SimVariant, Slo, run_pair
from tandem.sim.simulator import SimConfig
from tandem.sim.trace import bursty_trace, compress, load_trace

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = ("replica_hours_per_day", "mean_replicas", "peak_replicas", "min_replicas", "slo_attainment", "ttft_p50_s",
        "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "scale_events", "lost", "unserved")  # fmt: skip


def trace_of(name: str, seed: int):
    conv = load_trace()
    if name == "conv":
        return conv
    lengths = [(r.prompt_tokens, r.output_tokens) for r in conv]
    return bursty_trace(len(conv) / 3600.0, 3600.0, lengths, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--name", default="v")
    parser.add_argument("--trace", choices=["conv", "bursty"], default="conv")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--slo-ttft-s", type=float, default=2.0)
    parser.add_argument("--slo-tpot-s", type=float, default=0.1)
    parser.add_argument("--target", type=float, default=0.99)
    parser.add_argument("--utilizations", default="0.4,0.5,0.6,0.7,0.8,0.9,1.0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    profile = Profile.from_json(args.profile.read_text())
    variant = SimVariant(args.name, profile)
    trace = compress(trace_of(args.trace, args.seed), args.rate_scale)
    duration = trace[-1].arrival_s
    slo = Slo(args.slo_ttft_s, args.slo_tpot_s, args.target)
    runs = []
    started = time.perf_counter()
    for policy, utilization in [("static-peak", None), ("capacity", None)] + [
        (p, float(u)) for p in ("hpa", "kpa") for u in args.utilizations.split(",")
    ]:
        result = run_pair(trace, variant, policy, slo, duration_s=duration, config=SimConfig(),
                          utilization=utilization or 0.7)  # fmt: skip
        row = result.row()
        runs.append({"policy": policy, "utilization": utilization, **{k: row[k] for k in KEYS}, "setup": row["setup"]})
        line = f"{policy:12} u={utilization or '-':>4} {row['mean_replicas']:6.2f} replicas "
        line += f"{row['slo_attainment']:.2%} TTFT p99 {row['ttft_p99_s']:.2f}s lost {row['lost']}"
        print(line, file=sys.stderr)
    wall = time.perf_counter() - started

    capacity = next(r for r in runs if r["policy"] == "capacity")
    static = next(r for r in runs if r["policy"] == "static-peak")
    bar = max(capacity["slo_attainment"], args.target)
    summary = {"capacity": capacity, "static-peak": static}
    for policy in ("hpa", "kpa"):
        ok = [r for r in runs if r["policy"] == policy and r["slo_attainment"] >= bar]
        best = min(ok, key=lambda r: r["replica_hours_per_day"], default=None)
        summary[policy] = best
        summary[f"capacity_saves_vs_{policy}"] = (
            1 - capacity["replica_hours_per_day"] / best["replica_hours_per_day"] if best else None
        )
    summary["capacity_saves_vs_static-peak"] = 1 - capacity["replica_hours_per_day"] / static["replica_hours_per_day"]
    payload = {
        "command": shlex.join([".venv/bin/python", *sys.argv]),
        "load": Path("/proc/loadavg").read_text().split()[:3],
        "wall_s": wall,
        "profile": {
            "recipe": profile.recipe,
            "hardware": profile.hardware,
            "source": profile.source,
            "source_note": profile.source_note,
            "accelerators": profile.accelerators,
        },
        "trace": {"name": args.trace, "requests": len(trace), "duration_s": duration, "rate_scale": args.rate_scale},
        "slo": {"ttft_s": args.slo_ttft_s, "tpot_s": args.slo_tpot_s, "target": args.target},
        "attainment_bar": bar,
        "summary": summary,
        "runs": runs,
        "attribution": [
            ATTRIBUTION[CONVERSATION_TRACE],
            *([profile.extra["attribution"]] if "attribution" in profile.extra else []),
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    for policy in ("hpa", "kpa", "static-peak"):
        saves = summary[f"capacity_saves_vs_{policy}"]
        print(f"capacity vs {policy}: " + (f"{saves:.1%} fewer replica-hours" if saves is not None
                                           else f"no setting reached {bar:.2%}"), file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
