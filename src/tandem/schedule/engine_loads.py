"""Loads of replicas tandem did not build: an external engine's Prometheus text -> ReplicaLoad.

A tandem replica reports its load on GET /load; vLLM, SGLang and llama.cpp's server publish
theirs as Prometheus gauges. One adapter per engine names the gauges for running requests, queued
requests and the fraction of the KV cache in use (`ADAPTERS`); `load_from_metrics` reads them with
prometheus_client's parser (a server with several engines or ranks publishes one series each:
requests are summed, KV fractions averaged). The result's `source` is the adapter's name.

- vllm: `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`
  (before vLLM 0.10 `vllm:gpu_cache_usage_perc`; both are a fraction in 0..1 despite the name).
- sglang (`--enable-metrics`): `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`.
- llamacpp (llama.cpp's `llama-server --metrics`): `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, and `llamacpp:kv_cache_usage_ratio` where the server still has it
  (llama.cpp removed it in 2025: KV use then reads 0, and the policies size by requests alone).
  llama-cpp-python's server (`python -m llama_cpp.server`) has no /metrics at all: use `none`.
- none: nothing is scraped; the gateway's own count of requests in flight stands for the load
  (`GATEWAY_INFLIGHT`, tandem.schedule.traffic.estimate), which is what it sees of any replica
  between reports anyway. It cannot see a queue the gateway did not fill, nor KV use.

A text without the adapter's running or waiting gauge is refused (ValueError): the wrong adapter
for the server, or metrics turned off; the gateway logs it and falls back to its in-flight counts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tandem.contracts import ReplicaLoad

__all__ = ["ADAPTERS", "GATEWAY_INFLIGHT", "MetricNames", "load_from_metrics", "metric_samples"]

GATEWAY_INFLIGHT = "gateway-inflight"


@dataclass(frozen=True)
class MetricNames:
    running: str
    waiting: str
    kv_used: tuple[str, ...]  # the first present wins (newer name first)


ADAPTERS: dict[str, MetricNames] = {
    "vllm": MetricNames("vllm:num_requests_running", "vllm:num_requests_waiting",
                        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")),
    "sglang": MetricNames("sglang:num_running_reqs", "sglang:num_queue_reqs", ("sglang:token_usage",)),
    "llamacpp": MetricNames("llamacpp:requests_processing", "llamacpp:requests_deferred",
                            ("llamacpp:kv_cache_usage_ratio",)),
}  # fmt: skip


def metric_samples(text: str) -> dict[str, list[float]]:
    """Prometheus text -> {sample name: its values, one per label set} (ValueError on text that does not parse)."""
    samples: dict[str, list[float]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append(sample.value)
    return dict(samples)


def load_from_metrics(
    adapter: str, text: str, *, replica_id: str, region: str, variant: str, healthy: bool = True
) -> ReplicaLoad:
    """One scrape of an external engine's metrics as a ReplicaLoad (source: the adapter's name)."""
    names = ADAPTERS.get(adapter)
    if names is None:
        raise ValueError(f"no metrics adapter {adapter!r} (known: {', '.join(ADAPTERS)})")
    samples = metric_samples(text)
    missing = [name for name in (names.running, names.waiting) if name not in samples]
    if missing:
        raise ValueError(f"no {missing[0]} in its metrics (is this a {adapter} server, with metrics on?)")
    # Requests add up over a server's engines (data-parallel ranks); KV use is each one's fraction: the mean.
    kv = next((samples[name] for name in names.kv_used if name in samples), [0.0])
    kv_used = sum(kv) / len(kv)
    return ReplicaLoad(
        replica_id=replica_id,
        region=region,
        variant=variant,
        running=max(0, round(sum(samples[names.running]))),
        waiting=max(0, round(sum(samples[names.waiting]))),
        kv_used=min(1.0, max(0.0, kv_used)),
        healthy=healthy,
        source=adapter,
    )
