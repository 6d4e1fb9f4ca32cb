"""Where one batch-1 decode step goes on the 134M Llama: kernels vs Python and dispatch.

    .venv/bin/python benchmarks/profile_decode_step.py [--recipes int8,int4] [--samples 300]

Times each piece of a step on its own, on a live engine (one sequence, 64-token prompt), each the
fastest of --samples single calls (a shared machine's noise only slows a call down): the whole
engine step, the runner's forward, the fused decoder's one C call over all layers, the LM head, the
final norm and embedding, ForwardBatch.build. The remainder of the step is Python bookkeeping
(batcher, sampling, stop checks, detokenizing). Also a cProfile of 200 steps, top entries by own
time. JSON: benchmarks/results/decode_step_profile.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

import torch
from common import build_bench_model, record
from rich.console import Console

from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import load_model
from tandem.model.forward_batch import ForwardBatch
from tandem.optimize import apply_recipe
from tandem.optimize.profile import synthetic_prompt


def fastest(fn, samples: int) -> float:
    best = float("inf")
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def profile(model_dir: Path, recipe: str, threads: int, samples: int) -> dict:
    optimized = apply_recipe(load_model(model_dir), recipe)
    config = EngineConfig(max_model_len=2048, kv_cache_tokens=2048, max_num_seqs=1, num_threads=threads)
    engine = Engine(optimized, config)
    engine.add_request(synthetic_prompt(32000, 64, 0), SamplingParams.greedy_params(1900, ignore_eos=True))
    for _ in range(5):
        engine.step()
    module, runner = optimized.model.module, engine.runner
    seq = engine.batcher.running[0]
    step = fastest(engine.step, samples)
    table, pos, size = seq.block_table, seq.num_computed, runner.block_size
    batch = ForwardBatch.build([[5]], [table], [pos], size, None, 1, runner.kernels)
    with torch.inference_mode():
        forward = fastest(lambda: runner.forward_scored([[5]], [table], [pos], [1]), samples)
        build = fastest(lambda: ForwardBatch.build([[5]], [table], [pos], size, None, 1, runner.kernels), samples)
        module(batch.tokens, runner.cache, batch)
        plan = module._decode_plan[1] if module._decode_plan else None
        hidden = module(batch.tokens, runner.cache, batch)
        head = fastest(lambda: module.logits(hidden), samples)
        parts = {"engine step": step, "runner forward": forward, "ForwardBatch.build": build, "LM head": head}
        if plan is not None:
            x = module.embed_tokens(batch.tokens)
            cos, sin = module.rope_cos[batch.positions], module.rope_sin[batch.positions]
            parts["layers (one C call)"] = fastest(lambda: plan.run(x, cos, sin, batch), samples)
            parts["embedding + rope rows + final norm"] = fastest(
                lambda: (
                    module.norm.fused(module.embed_tokens(batch.tokens))
                    + module.rope_cos[batch.positions][:, :1]
                    + module.rope_sin[batch.positions][:, :1]
                ),
                samples,
            )
            parts["rest of the step (Python: batcher, sampling, stop rules, detokenizing)"] = (
                step - parts["layers (one C call)"] - head
            )
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [engine.step() for _ in range(200)])
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    return {"recipe": recipe, "threads": threads, "ms": parts, "cprofile_200_steps": text.getvalue()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", default="int8,int4")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "tandem-bench-134m")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model_dir = build_bench_model(a.model_dir)
    results = [profile(model_dir, recipe, a.threads, a.samples) for recipe in a.recipes.split(",")]
    for r in results:
        Console().print(f"[bold]{r['recipe']}[/bold], {r['threads']} threads, fastest of {a.samples} calls each:")
        for name, ms in r["ms"].items():
            Console().print(f"  {name:70s} {ms:7.3f} ms")
    path = record("decode_step_profile", {"samples": a.samples, "results": results})
    Console().print(f"recorded {path}")


if __name__ == "__main__":
    main()
