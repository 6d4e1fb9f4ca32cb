"""Constrained (a moderate JSON schema) against unconstrained decoding on the bundled model, side by side.

Batch 1, 8 and 32, greedy, with and without speculation. Each (recipe, batch, mode) runs `--rounds`
times in rotation and keeps its fastest round (the machine is shared: noise only slows a run).
Reported per cell: output tokens/s, the constrained/unconstrained ratio, and the grammar's mask
time per engine step (computing the matchers' bitmasks and applying them, all rows of the step).
The unconstrained runs ignore EOS and generate as many tokens per request as the constrained runs
did on average, so both decode the same lengths. The schema's compile time is measured once (cold)
and again from the cache.

    python benchmarks/bench_structured.py [--batches 1,8,32] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time

from common import record

from tandem.engine import Engine, EngineConfig, GrammarSpec, SamplingParams
from tandem.model import load_model
from tandem.optimize import apply_recipe

RECIPES = ["baseline", "speculative(k=4, max_batch=64)"]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 24},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "zip"],
            "additionalProperties": False,
        },
        "score": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 100}, {"type": "null"}]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "score", "active"],
    "additionalProperties": False,
}
SPEC = GrammarSpec("json", json.dumps(SCHEMA))


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int, float, int]:
    """(seconds, output tokens, grammar mask seconds, steps that masked)."""
    mask0, steps0 = engine.grammar_mask_seconds, engine.grammar_mask_steps
    started = time.perf_counter()
    outs = engine.generate(prompts, [params] * len(prompts))
    seconds = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outs)
    return seconds, tokens, engine.grammar_mask_seconds - mask0, engine.grammar_mask_steps - steps0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    engines = {
        r: Engine(apply_recipe(load_model(), r), EngineConfig(max_num_seqs=max(batches), num_threads=args.threads))
        for r in RECIPES
    }
    tokenizer = engines["baseline"].model.tokenizer
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "A user record as JSON."}]))
    started = time.perf_counter()
    _ = engines["baseline"].grammars  # the tokenizer's trie, built once per engine
    tokenizer_build = time.perf_counter() - started
    started = time.perf_counter()
    engines["baseline"].check_grammar(SPEC)
    compile_cold = time.perf_counter() - started
    started = time.perf_counter()
    engines["baseline"].check_grammar(SPEC)
    compile_cached = time.perf_counter() - started
    for engine in engines.values():
        engine.generate([prompt], SamplingParams.greedy_params(8, grammar=SPEC))  # warm up both paths
        engine.generate([prompt], SamplingParams.greedy_params(8, ignore_eos=True))
    best: dict[tuple[str, int, str], tuple[float, int, float, int]] = {}
    lengths: dict[tuple[str, int], int] = {}
    for round_ in range(args.rounds):
        for recipe in RECIPES[round_ % 2 :] + RECIPES[: round_ % 2]:
            engine = engines[recipe]
            for batch in batches:
                prompts = [prompt] * batch
                constrained = run(engine, prompts, SamplingParams.greedy_params(args.max_tokens, grammar=SPEC))
                lengths[(recipe, batch)] = max(1, round(constrained[1] / batch))
                plain = SamplingParams.greedy_params(lengths[(recipe, batch)], ignore_eos=True)
                unconstrained = run(engine, prompts, plain)
                for mode, result in (("constrained", constrained), ("unconstrained", unconstrained)):
                    key = (recipe, batch, mode)
                    if key not in best or result[1] / result[0] > best[key][1] / best[key][0]:
                        best[key] = result
    rows = []
    for recipe in RECIPES:
        for batch in batches:
            c, u = best[(recipe, batch, "constrained")], best[(recipe, batch, "unconstrained")]
            c_rate, u_rate = c[1] / c[0], u[1] / u[0]
            rows.append(
                {
                    "recipe": recipe,
                    "batch": batch,
                    "tokens_per_request": lengths[(recipe, batch)],
                    "unconstrained_tok_s": round(u_rate, 1),
                    "constrained_tok_s": round(c_rate, 1),
                    "ratio": round(c_rate / u_rate, 3),
                    "mask_ms_per_step": round(1e3 * c[2] / max(1, c[3]), 3),
                    "mask_share_of_time": round(c[2] / c[0], 4),
                }
            )
    print(f"grammar tokenizer build (once per engine): {tokenizer_build * 1e3:.1f} ms")
    print(f"schema compile: cold {compile_cold * 1e3:.2f} ms, cached {compile_cached * 1e6:.1f} us")
    print(
        f"{'recipe':34} {'batch':>5} {'tok/req':>7} {'plain tok/s':>11} {'json tok/s':>10} {'ratio':>6} "
        f"{'mask ms/step':>12}"
    )
    for r in rows:
        print(
            f"{r['recipe']:34} {r['batch']:>5} {r['tokens_per_request']:>7} {r['unconstrained_tok_s']:>11} "
            f"{r['constrained_tok_s']:>10} {r['ratio']:>6} {r['mask_ms_per_step']:>12}"
        )
    path = record(
        "structured_output",
        {
            "schema": SCHEMA,
            "tokenizer_build_ms": round(tokenizer_build * 1e3, 1),
            "compile_ms_cold": round(compile_cold * 1e3, 3),
            "compile_us_cached": round(compile_cached * 1e6, 2),
            "threads": args.threads,
            "rounds": args.rounds,
            "rows": rows,
        },
    )
    print(f"recorded {path}")


if __name__ == "__main__":
    main()
