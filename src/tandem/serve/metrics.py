"""Prometheus metrics with vLLM's names, under a `tandem:` prefix or (`--metrics-prefix vllm`) vLLM's own.

With the vllm prefix an existing vLLM Grafana dashboard, KEDA trigger or KServe rule reads a tandem
replica unchanged: the same family names, types, buckets and the `model_name` label (tandem adds
`recipe`). Families (each `<prefix>name`):

- gauges: num_requests_running, num_requests_waiting, kv_cache_usage_perc (0..1: KV slots held);
- counters: prompt_tokens, generation_tokens, request_success{finished_reason}, prefix_cache_queries,
  prefix_cache_hits, spec_decode_num_drafts, spec_decode_num_draft_tokens,
  spec_decode_num_accepted_tokens, spec_decode_num_accepted_tokens_per_pos{position};
- histograms per request: time_to_first_token_seconds, inter_token_latency_seconds,
  e2e_request_latency_seconds, request_queue_time_seconds, request_prefill_time_seconds,
  request_decode_time_seconds, request_inference_time_seconds, request_prompt_tokens,
  request_generation_tokens; per engine step: iteration_tokens_total;
- HTTP responses: http_requests_total{handler,method,status} (vLLM's, from
  prometheus-fastapi-instrumentator, is unprefixed and so is this one under the vllm prefix; the
  status is the exact code, so 401, 413 and 429 rejections are told apart).

Gauges and token counters are read from the engine at scrape time (the engine's own counters are
the truth, speculative tokens included); latency and per-request histograms are observed per
sequence when it finishes, from the engine's timestamps of it. Each app owns its registry, so
several apps (tests) can live in one process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from tandem.engine import RequestMetrics

__all__ = ["EngineStats", "PREFIXES", "ServerMetrics", "SequenceTimer", "token_buckets"]

PREFIXES = {"tandem": "tandem:", "vllm": "vllm:"}
LABELS = ("model_name", "recipe")
# vLLM's buckets, so histogram_quantile panels read the same.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip
# Tokens per engine step: vLLM's are its CUDA-graph sizes and its token budget; these cover the same range.
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# Paths whose requests are not counted in http_requests_total (vLLM leaves out the same kind): the
# scrape itself, probes and the gateway's polls, which would drown the API's traffic.
UNCOUNTED_PATHS = ("/metrics", "/health", "/ready", "/load")


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len: vLLM's buckets for per-request token counts."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


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
    kv_used: float = 0.0  # fraction of the KV cache held by running sequences
    drafts: int = 0  # sequence-steps that verified a draft
    accepted_per_position: tuple[int, ...] = ()  # [i]: drafts whose token i was accepted


class _EngineCollector(Collector):
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.source: Callable[[], EngineStats] | None = None
        self.labels: tuple[str, str] = ("", "")

    def collect(self) -> Iterator[Metric]:
        stats = self.source() if self.source else None

        def family(kind, name: str, doc: str, value: float | None):
            metric = kind(self.prefix + name, doc, labels=LABELS)
            if stats is not None:
                metric.add_metric(self.labels, value)
            return metric

        s = stats or EngineStats(0, 0, 0, 0, 0, 0)
        yield family(GaugeMetricFamily, "num_requests_running", "Sequences in KV slots right now.", s.running)
        yield family(GaugeMetricFamily, "num_requests_waiting", "Sequences waiting for a KV slot.", s.waiting)
        yield family(
            GaugeMetricFamily,
            "kv_cache_usage_perc",
            "KV-cache usage: the fraction of KV slots held by running sequences (1 means 100 percent).",
            s.kv_used,
        )
        yield family(
            CounterMetricFamily,
            "prompt_tokens",
            "Prompt tokens (prefilled, or reused from the prefix cache).",
            s.prompt_tokens,
        )
        yield family(CounterMetricFamily, "generation_tokens", "Generated tokens.", s.generation_tokens)
        yield family(
            CounterMetricFamily, "spec_decode_num_drafts", "Drafts verified (one per sequence and step).", s.drafts
        )
        yield family(
            CounterMetricFamily, "spec_decode_num_draft_tokens", "Tokens proposed by the speculator.", s.drafted_tokens
        )
        yield family(
            CounterMetricFamily,
            "spec_decode_num_accepted_tokens",
            "Drafted tokens the target accepted.",
            s.accepted_tokens,
        )
        per_position = CounterMetricFamily(
            self.prefix + "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by their position in the draft.",
            labels=(*LABELS, "position"),
        )
        for position, count in enumerate(s.accepted_per_position if stats is not None else ()):
            per_position.add_metric((*self.labels, str(position)), count)
        yield per_position
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
    def __init__(self, prefix: str = "tandem") -> None:
        if prefix not in PREFIXES:
            raise ValueError(f"metrics prefix {prefix!r}: expected one of {', '.join(PREFIXES)}")
        self.prefix = name = PREFIXES[prefix]
        self.registry = CollectorRegistry(auto_describe=True)
        self._engine = _EngineCollector(name)
        self.registry.register(self._engine)

        def histogram(family: str, doc: str, buckets) -> Histogram:
            return Histogram(name + family, doc, LABELS, buckets=buckets, registry=self.registry)

        self.ttft = histogram("time_to_first_token_seconds", "Time from request arrival to first token.", TTFT_BUCKETS)
        self.itl = histogram(
            "inter_token_latency_seconds", "Time between successive outputs of a sequence.", ITL_BUCKETS
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds", "Time from arrival to the last token.", REQUEST_LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "request_queue_time_seconds", "Time a request waited before its first step.", REQUEST_LATENCY_BUCKETS
        )
        self.prefill_time = histogram(
            "request_prefill_time_seconds",
            "Time from a request's first step to its first token.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "request_decode_time_seconds", "Time from a request's first token to its last.", REQUEST_LATENCY_BUCKETS
        )
        self.inference_time = histogram(
            "request_inference_time_seconds",
            "Time from a request's first step to its last token.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.iteration_tokens = histogram(
            "iteration_tokens_total", "Tokens per engine step (prefilled and generated).", ITERATION_TOKEN_BUCKETS
        )
        self.success = Counter(
            name + "request_success",
            "Finished sequences by finish reason.",
            (*LABELS, "finished_reason"),
            registry=self.registry,
        )
        # vLLM's HTTP counter (prometheus-fastapi-instrumentator's) has no prefix: under vllm neither has this.
        self.http_requests = Counter(
            ("" if prefix == "vllm" else name) + "http_requests",
            "HTTP responses by route, method and status code (rejections at the edge included).",
            ("handler", "method", "status"),
            registry=self.registry,
        )
        self.prompt_tokens: Histogram | None = None  # bucketed by the context length: made in bind()
        self.generation_tokens: Histogram | None = None
        self.labels: tuple[str, str] | None = None

    def bind(
        self, model_name: str, recipe: str, max_model_len: int, engine_stats: Callable[[], EngineStats]
    ) -> Callable[[int], None]:
        """Start reporting for the loaded model (called once it is ready). Returns the engine's per-step hook."""
        self.labels = (model_name, recipe)
        self._engine.labels = self.labels
        self._engine.source = engine_stats
        buckets = token_buckets(max_model_len)
        self.prompt_tokens = Histogram(
            self.prefix + "request_prompt_tokens", "Prompt tokens per request.", LABELS, buckets=buckets,
            registry=self.registry,
        )  # fmt: skip
        self.generation_tokens = Histogram(
            self.prefix + "request_generation_tokens", "Generated tokens per request.", LABELS, buckets=buckets,
            registry=self.registry,
        )  # fmt: skip
        # Every series present at zero from the start, so rate() and histogram_quantile() work at once.
        for histogram in self._request_histograms():
            histogram.labels(*self.labels)
        for reason in ("stop", "length", "abort"):
            self.success.labels(*self.labels, reason)
        iteration = self.iteration_tokens.labels(*self.labels)
        return iteration.observe

    def _request_histograms(self) -> tuple[Histogram, ...]:
        return tuple(
            h
            for h in (
                self.ttft, self.itl, self.e2e, self.queue_time, self.prefill_time, self.decode_time,
                self.inference_time, self.iteration_tokens, self.prompt_tokens, self.generation_tokens,
            )
            if h is not None
        )  # fmt: skip

    def count_response(self, handler: str, method: str, status: int) -> None:
        self.http_requests.labels(handler, method, str(status)).inc()

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

    def on_finish(
        self,
        reason: str,
        now: float,
        engine: RequestMetrics | None = None,
        prompt_tokens: int | None = None,
        generation_tokens: int | None = None,
    ) -> None:
        """The sequence ended. `engine`: its timestamps in the engine (queue, prefill, decode phases)."""
        labels = self.metrics.labels
        if self.done or labels is None:
            return
        self.done = True
        m = self.metrics
        m.e2e.labels(*labels).observe(now - self.arrival)
        m.success.labels(*labels, reason).inc()
        if prompt_tokens is not None and m.prompt_tokens is not None:
            m.prompt_tokens.labels(*labels).observe(prompt_tokens)
        if generation_tokens is not None and m.generation_tokens is not None:
            m.generation_tokens.labels(*labels).observe(generation_tokens)
        if engine is None or engine.first_scheduled_time is None:
            return
        scheduled = engine.first_scheduled_time
        m.queue_time.labels(*labels).observe(scheduled - engine.arrival_time)
        if engine.first_token_time is not None and engine.last_token_time is not None:
            m.prefill_time.labels(*labels).observe(engine.first_token_time - scheduled)
            m.decode_time.labels(*labels).observe(engine.last_token_time - engine.first_token_time)
            m.inference_time.labels(*labels).observe(engine.last_token_time - scheduled)
