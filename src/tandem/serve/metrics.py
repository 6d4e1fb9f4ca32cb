"""Prometheus metrics named as vLLM's with a `tandem:` prefix, so vLLM dashboards port by a prefix swap.

Every series carries `model_name` (vLLM's label) and `recipe`. Gauges and token counters are read
from the engine at scrape time (the engine's own counters are the truth, speculative tokens
included); latency histograms and finished-request counts are observed per sequence by the server.
Each app owns its registry, so several apps (tests) can live in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ServerMetrics", "SequenceTimer", "EngineStats", "PREFIX"]

PREFIX = "tandem:"
LABELS = ("model_name", "recipe")
# vLLM's buckets, so histogram_quantile panels read the same.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's gauges and counters."""

    running: int
    waiting: int
    prompt_tokens: int
    generation_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens whose keys and values were reused


class _EngineCollector(Collector):
    def __init__(self) -> None:
        self.source: Callable[[], EngineStats] | None = None
        self.labels: tuple[str, str] = ("", "")

    def collect(self) -> Iterator[Metric]:
        stats = self.source() if self.source else None

        def family(kind, name: str, doc: str, value: float | None):
            metric = kind(PREFIX + name, doc, labels=LABELS)
            if stats is not None:
                metric.add_metric(self.labels, value)
            return metric

        s = stats or EngineStats(0, 0, 0, 0, 0, 0)
        yield family(GaugeMetricFamily, "num_requests_running", "Sequences in KV slots right now.", s.running)
        yield family(GaugeMetricFamily, "num_requests_waiting", "Sequences waiting for a KV slot.", s.waiting)
        yield family(
            CounterMetricFamily,
            "prompt_tokens",
            "Prompt tokens (prefilled, or reused from the prefix cache).",
            s.prompt_tokens,
        )
        yield family(CounterMetricFamily, "generation_tokens", "Generated tokens.", s.generation_tokens)
        yield family(
            CounterMetricFamily, "spec_decode_num_draft_tokens", "Tokens proposed by the speculator.", s.drafted_tokens
        )
        yield family(
            CounterMetricFamily,
            "spec_decode_num_accepted_tokens",
            "Drafted tokens the target accepted.",
            s.accepted_tokens,
        )
        # vLLM's prefix-cache counters, in tokens: hits / queries is the hit rate.
        yield family(
            CounterMetricFamily,
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            s.prefix_cache_queries,
        )
        yield family(
            CounterMetricFamily,
            "prefix_cache_hits",
            "Prompt tokens whose keys and values came from the prefix cache.",
            s.prefix_cache_hits,
        )


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._engine = _EngineCollector()
        self.registry.register(self._engine)
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time from request arrival to first token.",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            PREFIX + "inter_token_latency_seconds",
            "Time between successive outputs of a sequence.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Time from arrival to the last token.",
            LABELS,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.success = Counter(
            PREFIX + "request_success",
            "Finished sequences by finish reason.",
            (*LABELS, "finished_reason"),
            registry=self.registry,
        )
        self.labels: tuple[str, str] | None = None

    def bind(self, model_name: str, recipe: str, engine_stats: Callable[[], EngineStats]) -> None:
        """Start reporting for the loaded model (called once it is ready)."""
        self.labels = (model_name, recipe)
        self._engine.labels = self.labels
        self._engine.source = engine_stats
        # Every series present at zero from the start, so rate() and histogram_quantile() work at once.
        for histogram in (self.ttft, self.itl, self.e2e):
            histogram.labels(*self.labels)
        for reason in ("stop", "length", "abort"):
            self.success.labels(*self.labels, reason)

    def timer(self, arrival: float) -> SequenceTimer:
        return SequenceTimer(self, arrival)


class SequenceTimer:
    """Latency bookkeeping of one sequence (one choice): first token, gaps, end, finish reason."""

    def __init__(self, metrics: ServerMetrics, arrival: float) -> None:
        self.metrics = metrics
        self.arrival = arrival
        self.last: float | None = None
        self.done = False

    def on_tokens(self, now: float) -> None:
        labels = self.metrics.labels
        if labels is None:
            return
        if self.last is None:
            self.metrics.ttft.labels(*labels).observe(now - self.arrival)
        else:
            self.metrics.itl.labels(*labels).observe(now - self.last)
        self.last = now

    def on_finish(self, reason: str, now: float) -> None:
        labels = self.metrics.labels
        if self.done or labels is None:
            return
        self.done = True
        self.metrics.e2e.labels(*labels).observe(now - self.arrival)
        self.metrics.success.labels(*labels, reason).inc()
