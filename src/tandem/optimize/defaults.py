"""The recipe served when none is named: the best recipe of the latest `tandem bench` on this CPU.

benchmarks/results/bench_bundled.json and bench_bundled_run2.json (64 trace-shaped requests, bundled
model, every row in its own process, 5 rounds, each row's fastest run): int8+kv-bf16+ngram gave
1.37x and 1.38x baseline's output tokens/s (27% lower cost per token), int8+ngram 1.38x and 1.34x;
in two earlier runs made row after row it led too. Its greedy predictions agree with baseline's as
often as int8's do (95.8%; tests/optimize/test_kv_cache.py), and n-gram lookup needs no draft
model in memory.

Long prompts (issue 17): decode attention reads every cached key and value each step, so at 1536
tokens and batch 8 it reads about 8x the int8 weights' bytes per step; the bfloat16 cache halves
that, and the register-blocked attention kernel now widens bf16 as it loads instead of converting
tiles: one layer's decode attention over 1536 keys at batch 8 ran 2.4x faster on the bf16 cache than
on the float32 one (1 thread, same process). That keeps kv-bf16 in the default. The end-to-end
long-prompt comparison (int8 vs int8+kv-bf16, 1536-token prompts, batch 8) is a row of
benchmarks/bench_vs_llamacpp.py; its run could not finish on the saturated shared machine of
2026-12-01, so this choice rests on the kernel measurement until it does.
"""

__all__ = ["DEFAULT_RECIPE", "recipe_or_default"]

DEFAULT_RECIPE = "int8+kv-bf16+ngram"


def recipe_or_default(recipe: str | None) -> str:
    """The recipe to run: the one asked for, else DEFAULT_RECIPE (read at call time). `tandem serve`
    and `tandem generate` both take theirs here, so the two quick-start commands run one recipe."""
    return recipe or DEFAULT_RECIPE
