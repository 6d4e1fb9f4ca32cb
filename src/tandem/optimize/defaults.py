"""The recipe served when none is named: the best recipe of the latest `tandem bench` on this CPU.

benchmarks/results/bench_bundled.json and bench_bundled_run2.json (64 trace-shaped requests, bundled
model, every row in its own process, 5 rounds, each row's fastest run): int8+kv-bf16+ngram gave
1.37x and 1.38x baseline's output tokens/s (27% lower cost per token), int8+ngram 1.38x and 1.34x;
in two earlier runs made row after row it led too. Its greedy predictions agree with baseline's as
often as int8's do (95.8%; tests/optimize/test_kv_cache.py), and n-gram lookup needs no draft
model in memory.
"""

__all__ = ["DEFAULT_RECIPE"]

DEFAULT_RECIPE = "int8+kv-bf16+ngram"
