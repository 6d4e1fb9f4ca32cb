"""The gateway's request metrics, beside the scheduling layer's (tandem.schedule.metrics) on one registry.

- `tandem:gateway_requests_total{variant,code}`: requests answered, by the variant that served the
  last attempt ("none" when no replica was reached) and the HTTP status sent (499: the client left);
- `tandem:gateway_request_duration_seconds{variant}`: arrival to the last byte sent;
- `tandem:gateway_time_to_first_byte_seconds{variant}`: arrival to the first byte of the answer
  (a stream's first event, or a whole non-streaming body);
- `tandem:gateway_buffered_requests{variant}`: requests waiting at the gateway for a replica now;
- `tandem:gateway_retries_total{variant}`: attempts re-run after failing on `variant`;
- `tandem:gateway_stream_errors_total{variant}`: streams that broke after their first byte and
  were not resumed (they end with an error event);
- `tandem:gateway_resumes_total{variant,reason}`: streams that broke on `variant` (reason: the
  failure kind, or `stream_idle`) and were resumed elsewhere (tandem.gateway.resume).

Every label comes from a closed set: variants of the deployment (or `none`), and the status codes
the gateway sends; no client-chosen text (a method, a path, a model name) ever becomes a label.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tandem.schedule.metrics import set_gauges

__all__ = ["GatewayMetrics", "NO_VARIANT"]

PREFIX = "tandem:gateway_"
NO_VARIANT = "none"
# From a cached short answer to a long stream (vLLM's e2e buckets, with the low end for the gateway's own 4xx/5xx).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            PREFIX + "requests",
            "Requests answered, by variant and HTTP status.",
            ("variant", "code"),
            registry=registry,
        )
        self.duration = Histogram(
            PREFIX + "request_duration_seconds",
            "From a request's arrival to the last byte sent.",
            ("variant",),
            buckets=BUCKETS,
            registry=registry,
        )
        self.ttfb = Histogram(
            PREFIX + "time_to_first_byte_seconds",
            "From a request's arrival to the first byte of its answer.",
            ("variant",),
            buckets=BUCKETS,
            registry=registry,
        )
        self.buffered = Gauge(
            PREFIX + "buffered_requests",
            "Requests waiting at the gateway for a replica.",
            ("variant",),
            registry=registry,
        )
        self.retries = Counter(
            PREFIX + "retries", "Attempts re-run after failing on `variant`.", ("variant",), registry=registry
        )
        self.stream_errors = Counter(
            PREFIX + "stream_errors",
            "Streams that broke after their first byte (ended with an error event).",
            ("variant",),
            registry=registry,
        )
        self.resumes = Counter(
            PREFIX + "resumes",
            "Streams that broke mid-way on `variant` and were resumed elsewhere, by reason.",
            ("variant", "reason"),
            registry=registry,
        )
        self.resumed_off: Tally[str] = Tally()  # replica id -> streams resumed off it (admin's recent exits)
        self._buffered_written: set[tuple[str, ...]] = set()

    def first_byte(self, variant: str, seconds: float) -> None:
        self.ttfb.labels(variant).observe(seconds)

    def finished(self, variant: str, code: int, seconds: float) -> None:
        self.requests.labels(variant, str(code)).inc()
        self.duration.labels(variant).observe(seconds)

    def observe_buffered(self, variants: Iterable[str], buffered: Mapping[str, int]) -> None:
        """Requests waiting per variant of the deployment now (a variant that left it loses its series)."""
        values = {(variant,): buffered.get(variant, 0) for variant in {*variants, *buffered}}
        set_gauges(self.buffered, values, self._buffered_written)
