"""A/B engine speed: the same workloads on two source trees, alternated in one run, as ratios.

For a change to a hot path (e.g. the paged KV cache): tree A (say main's src/, exported with
`git archive`) and tree B (this one) each run, in their own subprocess and in turns (A, B, A, B ...,
best of --rounds), on the 134M benchmark Llama (benchmarks/common.py), fp32:
- decode: batch 1/8/32, a 32-token prompt each, --new-tokens greedy tokens;
- long prompt: one 1536-token prompt prefilled in chunks of 512, then 16 tokens (decode steps
  reading 1536+ keys).
`--recipes` runs every case under each recipe (default baseline; e.g. baseline,int8+kv-bf16).
Reported: the fastest decode step of each side (the least disturbed by other load: the engine's
own cost) and the time to first token, best of the rounds, in wall time and in the process's CPU
time (on a loaded machine the CPU seconds are the steadier measure; with --threads 1 they are the
work itself); absolute times on a shared machine are noise, the B/A ratios measured side by side
are the result.

    git archive main src | tar -x -C /tmp/a
    python benchmarks/bench_ab.py --a /tmp/a/src --b src [--rounds 3] [--new-tokens 64] [--recipes baseline,int8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import build_bench_model, record

WORKER = r"""
import json, sys, time
import torch
from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import load_model
from tandem.optimize import apply_recipe

path, kind, batch, new_tokens, recipe = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
optimized = apply_recipe(load_model(path), recipe)
vocab = optimized.model.config.vocab_size
g = torch.Generator().manual_seed(batch)
if kind == "decode":
    prompt_len, max_len = 32, 32 + new_tokens + 1
    config = EngineConfig(max_model_len=max_len, kv_cache_tokens=max_len * batch, max_num_seqs=batch)
else:
    prompt_len, max_len = 1536, 2048
    config = EngineConfig(max_model_len=max_len, kv_cache_tokens=max_len, max_num_seqs=1, max_prefill_tokens=512)
engine = Engine(optimized, config)
prompts = torch.randint(2, vocab, (batch, prompt_len), generator=g).tolist()
engine.generate([p[:40] for p in prompts], SamplingParams.greedy_params(4, ignore_eos=True))  # warm up
engine = Engine(optimized, config)  # a fresh cache: nothing of the warm-up is reused
for i, p in enumerate(prompts):
    engine.add_request(p, SamplingParams.greedy_params(new_tokens, ignore_eos=True), str(i))
t0, c0 = time.perf_counter(), time.process_time()
first = first_cpu = None
tokens = 0
steps = []  # (seconds, CPU seconds, tokens) of every step after the first token: the fastest is the least disturbed
while engine.has_unfinished():
    started, cpu = time.perf_counter(), time.process_time()
    made = sum(len(out.new_token_ids) for out in engine.step())
    if first is not None:
        steps.append((time.perf_counter() - started, time.process_time() - cpu, made))
    tokens += made
    if first is None and made:
        first, first_cpu = time.perf_counter(), time.process_time()
end = time.perf_counter()
full = [s for s in steps if s[2] == batch] or steps
wall = sorted(s[0] for s in full)
print(json.dumps({"tokens_per_s": tokens / (end - t0), "ttft_s": first - t0, "ttft_cpu_s": first_cpu - c0,
                  "best_step_s": wall[0], "median_step_s": wall[len(wall) // 2],
                  "best_step_cpu_s": min(s[1] for s in full)}))
"""


BEST_OF = {"best_step_s", "best_step_cpu_s", "ttft_s", "ttft_cpu_s"}  # each side's best over the rounds


def run(src: Path, model: Path, kind: str, batch: int, new_tokens: int, threads: int | None, recipe: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src.resolve())}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(model), kind, str(batch), str(new_tokens), recipe],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="tree A's src/ directory (the baseline)")
    parser.add_argument("--b", type=Path, required=True, help="tree B's src/ directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", default="1,8,32", help='decode batch sizes ("": the long prompt alone)')
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--recipes", default="baseline", help="comma-separated recipes, each case under each")
    parser.add_argument("--record", default=None, help="record the results as benchmarks/results/NAME.json")
    args = parser.parse_args()
    model = build_bench_model(Path(tempfile.gettempdir()) / "tandem-bench-134m")
    shapes = [("decode", int(b), args.new_tokens) for b in args.batches.split(",") if b] + [("long-prompt", 1, 16)]
    cases = [(recipe, *shape) for recipe in args.recipes.split(",") for shape in shapes]
    results = []
    for recipe, kind, batch, new_tokens in cases:
        best = {"a": None, "b": None}
        for _ in range(args.rounds):
            for side, src in (("a", args.a), ("b", args.b)):
                got = run(src, model, kind, batch, new_tokens, args.threads, recipe)
                kept = best[side] or got
                best[side] = {key: min(got[key], kept[key]) for key in BEST_OF} | {
                    key: got[key] if got["best_step_s"] <= kept["best_step_s"] else kept[key]
                    for key in got.keys() - BEST_OF
                }
        a, b = best["a"], best["b"]
        row = {"recipe": recipe, "case": kind, "batch": batch, "a": a, "b": b}
        row["step_ratio_b_over_a"] = b["best_step_s"] / a["best_step_s"]  # < 1: B decodes faster
        row["ttft_ratio_b_over_a"] = b["ttft_s"] / a["ttft_s"]
        # CPU time per step: what the step cost the process, whatever else ran (a loaded machine
        # stretches wall time, much less the CPU seconds; with --threads 1 they are the work itself)
        row["step_cpu_ratio_b_over_a"] = b["best_step_cpu_s"] / a["best_step_cpu_s"]
        row["ttft_cpu_ratio_b_over_a"] = b["ttft_cpu_s"] / a["ttft_cpu_s"]
        print(f"{recipe:14s} {kind:12s} batch {batch:3d}: fastest decode step A {a['best_step_s'] * 1e3:.2f} ms "
              f"B {b['best_step_s'] * 1e3:.2f} ms (B/A {row['step_ratio_b_over_a']:.3f}, CPU time "
              f"{row['step_cpu_ratio_b_over_a']:.3f}); time to first token B/A {row['ttft_ratio_b_over_a']:.3f} "
              f"(CPU time {row['ttft_cpu_ratio_b_over_a']:.3f})", flush=True)  # fmt: skip
        results.append(row)
    if args.record is not None:
        record(args.record, {"rounds": args.rounds, "recipes": args.recipes, "results": results})


if __name__ == "__main__":
    main()
