"""Default engine threads and OpenMP wait policy, by measurement: alone and with a client on the machine.

Each (threads, OMP_WAIT_POLICY) cell is measured two ways, each in fresh processes (the policy is
read when OpenMP starts):
- alone: one process runs the engine over --rows requests of --max-tokens tokens (no HTTP, nothing
  else of ours on the machine), output tokens/s;
- with a client: a `tandem serve` with those settings and benchmarks/load_test.py's streaming clients
  (--clients x --requests-per-client, --max-tokens each) on the same machine over loopback: output
  tokens/s, TTFT and TPOT p50.

`ACTIVE` is what OpenMP does unset (threads spin a while before sleeping); `PASSIVE` sleeps at once.

    python benchmarks/bench_threads.py [--threads 1,2] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from common import record
from load_test import measure, start_server

ALONE = """
import sys, time
from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import load_model
from tandem.optimize import apply_recipe
from tandem.optimize.defaults import DEFAULT_RECIPE
threads, rows, tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
engine = Engine(apply_recipe(load_model(), DEFAULT_RECIPE), EngineConfig(max_num_seqs=rows, num_threads=threads))
params = SamplingParams(max_tokens=tokens, temperature=0.8, seed=0, ignore_eos=True)
engine.generate(["def f():\\n"], [SamplingParams.greedy_params(8)])
started = time.perf_counter()
outs = engine.generate(["def main():\\n"] * rows, [params] * rows)
print(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - started))
"""


def env_for(policy: str) -> dict[str, str]:
    return {**os.environ, "OMP_WAIT_POLICY": policy}


def alone(threads: int, policy: str, args: argparse.Namespace) -> float:
    out = subprocess.run(
        [sys.executable, "-c", ALONE, str(threads), str(args.rows), str(args.max_tokens)],
        env=env_for(policy), capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    return round(float(out.stdout.strip().splitlines()[-1]), 1)


def with_client(threads: int, policy: str, args: argparse.Namespace) -> dict:
    log_path = Path(tempfile.mkdtemp(prefix="tandem-threads-")) / "server.log"
    saved = os.environ.copy()
    os.environ.clear()
    os.environ.update(env_for(policy))  # start_server passes our environment to the server
    try:
        proc, url = start_server(["--threads", str(threads), "--max-num-seqs", str(args.clients)], log_path)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        run = measure(url, args)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    s = run["summary"]
    return {
        "recipe": run["recipe"],
        "output_tok_s": round(s["output_tokens_per_s"], 1),
        "ttft_p50_ms": round(1e3 * s["ttft_s"]["p50"], 1),
        "tpot_p50_ms": round(1e3 * s["tpot_s"]["p50"], 2),
        "errors": s["errors"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--policies", default="ACTIVE,PASSIVE")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--deadline", type=float, default=600.0)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    cells = [(int(t), p) for t in args.threads.split(",") for p in args.policies.split(",")]
    rows = []
    for threads, policy in cells:
        best_alone, best_client = 0.0, None
        for _ in range(args.rounds):
            best_alone = max(best_alone, alone(threads, policy, args))
            client = with_client(threads, policy, args)
            if best_client is None or client["output_tok_s"] > best_client["output_tok_s"]:
                best_client = client
        row = {"threads": threads, "omp_wait_policy": policy, "alone_tok_s": best_alone, "with_client": best_client}
        print(row, file=sys.stderr)
        rows.append(row)
    path = record(
        "threads",
        {
            "rows": args.rows, "clients": args.clients, "requests_per_client": args.requests_per_client,
            "max_tokens": args.max_tokens, "rounds": args.rounds,
            "note": "the machine (2 cores) was shared with other agents' builds, tests and benchmarks during the run",
            "cells": rows,
        },
    )  # fmt: skip
    print(f"recorded {path}")


if __name__ == "__main__":
    main()
