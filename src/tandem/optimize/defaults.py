"""The recipe served when none is named: the best recipe of the latest `tandem bench` on this CPU.

benchmarks/results/bench_bundled.json (64 trace-shaped requests, bundled model): int8+speculative
had the highest output tokens/s and the lowest cost per million tokens (1.38x baseline, 27%
cheaper), with int8 and int8+ngram within 3% of it.
"""

__all__ = ["DEFAULT_RECIPE"]

DEFAULT_RECIPE = "int8+speculative"
