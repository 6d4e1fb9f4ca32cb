"""The recipe served when none is named: the best recipe of the latest `tandem bench` on this CPU.

benchmarks/results/bench_bundled.json (64 trace-shaped requests, bundled model): int8+ngram had the
highest output tokens/s and the lowest cost per million tokens (1.57x baseline, 35% cheaper).
"""

__all__ = ["DEFAULT_RECIPE"]

DEFAULT_RECIPE = "int8+ngram"
