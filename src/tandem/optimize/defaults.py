"""The recipe served when none is named: the best recipe of the latest `tandem bench` on this CPU.

benchmarks/results/bench_bundled.json and bench_bundled_run2.json (64 trace-shaped requests, bundled
model, fastest of 5 runs per row, two runs of the same command): int8+kv-bf16+ngram had the highest
output tokens/s and the lowest cost per million tokens in both (1.59x and 1.29x baseline; the
machine's noise moves whole runs), ahead of int8+ngram (1.54x, 1.25x). Its greedy predictions
agree with baseline's as often as int8's do (95.8%; tests/optimize/test_kv_cache.py), and n-gram
lookup needs no draft model in memory.
"""

__all__ = ["DEFAULT_RECIPE"]

DEFAULT_RECIPE = "int8+kv-bf16+ngram"
