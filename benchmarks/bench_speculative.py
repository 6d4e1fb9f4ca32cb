"""Speculative and n-gram decoding vs baseline on the bundled target/draft pair, in one run.

Held-out code prompts (never trained on), greedy, each batch size measured for every recipe. The
batch size where verification stops paying is printed: the `max_batch` default of `speculative`.

    python benchmarks/bench_speculative.py [--batches 1,2,4,8,16] [--ks 2,3,4,5] [--ngram-ks 4,6,8] [--repeats 3]
"""

from __future__ import annotations

import argparse

from common import record
from rich.console import Console
from rich.table import Table

from tandem.engine import Engine, EngineConfig
from tandem.model import load_model
from tandem.optimize import apply_recipe
from tandem.optimize.profile import decode_rate
from tandem.workload import heldout_texts


def code_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` tokens: consecutive windows of the held-out files."""
    prompts = []
    for text in heldout_texts():
        ids = tokenizer.encode(text)
        prompts += [ids[i : i + length] for i in range(0, len(ids) - length, length)]
    if len(prompts) < count:
        raise SystemExit(f"need {count} held-out windows of {length} tokens, have {len(prompts)}")
    return prompts[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,2,4,8,16")
    parser.add_argument("--ks", default="2,3,4,5")
    parser.add_argument("--ngram-ks", default="4,6,8")
    parser.add_argument("--base", default="baseline", help="recipe prefix, e.g. int8")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds-prompts", type=int, default=16, help="prompts per batch size (in rounds)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each round; the fastest counts (as timeit: noise only slows)"
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    prefix = "" if args.base == "baseline" else args.base + "+"
    recipes = [args.base] + [f"{prefix}speculative(k={k}, max_batch=64)" for k in args.ks.split(",")]
    recipes += [f"{prefix}ngram(k={k}, max_batch=64)" for k in args.ngram_ks.split(",")]
    console = Console()
    rows = []
    for recipe in recipes:
        model = load_model(args.model)
        prompts = code_prompts(model.tokenizer, max(max(batches), args.rounds_prompts), args.prompt_len)
        engine = Engine(
            apply_recipe(model, recipe),
            EngineConfig(max_model_len=model.config.max_position_embeddings, max_num_seqs=max(batches)),
        )
        decode_rate(engine, prompts[:1], 8)  # warm-up
        for batch in batches:
            drafted, accepted = engine.num_drafted_tokens, engine.num_accepted_tokens
            # Small batches run several rounds on different prompts: one prompt's acceptance is
            # not representative (a repetitive continuation is accepted wholesale).
            rounds = [prompts[i : i + batch] for i in range(0, args.rounds_prompts, batch)]
            rates = [max(decode_rate(engine, group, args.new_tokens) for _ in range(args.repeats)) for group in rounds]
            rate = len(rates) / sum(1 / r for r in rates)  # tokens/s over equal token counts
            drafted, accepted = engine.num_drafted_tokens - drafted, engine.num_accepted_tokens - accepted
            rows.append(
                dict(
                    recipe=recipe,
                    batch=batch,
                    tokens_per_s=rate,
                    acceptance_rate=accepted / drafted if drafted else None,
                )
            )
            console.print(f"{recipe} batch {batch}: {rate:.1f} tok/s")
    base = {r["batch"]: r["tokens_per_s"] for r in rows if r["recipe"] == args.base}
    table = Table(title=f"Decode tok/s on the bundled pair vs {args.base} (same run), held-out code prompts")
    for col in ("recipe", *[f"b={b}" for b in batches]):
        table.add_column(col, justify="right")
    for recipe in recipes:
        cells = []
        for r in (r for r in rows if r["recipe"] == recipe):
            r["vs_base"] = r["tokens_per_s"] / base[r["batch"]]
            accept = f" a={r['acceptance_rate']:.0%}" if r["acceptance_rate"] is not None else ""
            cells.append(f"{r['tokens_per_s']:.0f} ({r['vs_base']:.2f}x{accept})")
        table.add_row(recipe, *cells)
    console.print(table)
    crossover = {}
    for recipe in recipes[1:]:
        paying = [r["batch"] for r in rows if r["recipe"] == recipe and r["vs_base"] > 1.0]
        crossover[recipe] = max(paying) if paying else 0
        console.print(f"{recipe}: pays up to batch {crossover[recipe]}")
    path = record(
        "speculative_bundled",
        {
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "rows": rows,
            "largest_paying_batch": crossover,
        },
    )
    console.print(f"recorded {path}")


if __name__ == "__main__":
    main()
