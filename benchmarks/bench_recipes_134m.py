"""int8 (and bf16) vs baseline decode on the 134M benchmark Llama, side by side in one run.

python benchmarks/bench_recipes_134m.py [--batches 1,8] [--new-tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import build_bench_model, record
from rich.console import Console
from rich.table import Table

from tandem.engine import Engine, EngineConfig
from tandem.model import load_model
from tandem.optimize import apply_recipe
from tandem.optimize.profile import decode_rate, synthetic_prompt

RECIPES = ["baseline", "bf16", "int8(lm_head=false)", "int8"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument(
        "--repeats", type=int, default=5, help="rounds; each row's fastest run counts (as timeit: noise only slows)"
    )
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "tandem-bench-134m")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model_dir = build_bench_model(args.model_dir)
    # Every recipe's engine first, then rounds: each round runs every recipe and batch size once,
    # and each keeps its fastest run. Rows run one after another let a slow spell of this shared
    # machine land on one recipe's runs only (baseline's fp32 weight streaming is the most exposed).
    prompts = [synthetic_prompt(32000, 32, seed=i) for i in range(max(batches))]
    engines = {}
    for recipe in args.recipes.split(","):
        optimized = apply_recipe(load_model(model_dir), recipe)
        engines[recipe] = (
            Engine(
                optimized,
                EngineConfig(max_model_len=256, kv_cache_tokens=256 * max(batches), max_num_seqs=max(batches)),
            ),
            optimized.model.weight_bytes,
        )
        decode_rate(engines[recipe][0], prompts[:1], 8)  # warm-up
    best: dict[tuple[str, int], float] = {}
    for round_ in range(args.repeats):
        for recipe, (engine, _) in engines.items():
            for batch in batches:
                rate = decode_rate(engine, prompts[:batch], args.new_tokens)
                best[recipe, batch] = max(best.get((recipe, batch), 0.0), rate)
        Console().print(f"round {round_ + 1}/{args.repeats} done")
    rows = [
        dict(recipe=recipe, batch=batch, tokens_per_s=best[recipe, batch], weight_bytes=weight_bytes)
        for recipe, (_, weight_bytes) in engines.items()
        for batch in batches
    ]
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["recipe"] == "baseline"}
    table = Table(title="Decode tok/s, 134M Llama, recipes vs baseline (same run)")
    for col in ("recipe", "batch", "tok/s", "ms/step", "vs baseline", "weight MB"):
        table.add_column(col, justify="right")
    for r in rows:
        r["vs_baseline"] = r["tokens_per_s"] / base[r["batch"]] if r["batch"] in base else None
        table.add_row(
            r["recipe"],
            str(r["batch"]),
            f"{r['tokens_per_s']:.1f}",
            f"{1e3 * r['batch'] / r['tokens_per_s']:.1f}",
            f"{r['vs_baseline']:.2f}x" if r["vs_baseline"] else "-",
            f"{r['weight_bytes'] / 1e6:.0f}",
        )
    Console().print(table)
    path = record("recipes_134m", {"new_tokens": args.new_tokens, "repeats": args.repeats, "rows": rows})
    Console().print(f"recorded {path}")


if __name__ == "__main__":
    main()
