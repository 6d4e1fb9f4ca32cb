"""The recipe served when none is named: the best recipe of the latest `tandem bench` on this CPU.

benchmarks/results/bench_bundled.json (64 trace-shaped requests, bundled model, fastest of 5 runs
per row): int8+ngram had the highest output tokens/s and the lowest cost per million tokens (1.45x
baseline, 31% cheaper), ahead of bf16 (1.35x), int8 and int8+speculative (1.31x each). n-gram
lookup also beat the draft model at every batch size in benchmarks/results/speculative_bundled.json,
and needs no second model in memory.
"""

__all__ = ["DEFAULT_RECIPE"]

DEFAULT_RECIPE = "int8+ngram"
