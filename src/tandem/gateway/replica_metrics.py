"""The replicas' own token, TTFT and KV series, aggregated per variant on the gateway's /metrics.

Each control-loop tick (tandem.gateway.app) the gateway reads every ready or draining replica's
Prometheus text (GET /metrics, with the fleet's secret; vLLM's names under the `tandem:` or `vllm:`
prefix, so an external vLLM replica counts too) and keeps its last values. At scrape time, per
variant of the deployment:

- `tandem:gateway_replica_prompt_tokens_total{variant}`, `..._generation_tokens_total{variant}`:
  counters summed over the variant's replicas, past ones included (a replica that left, or
  restarted and began again from zero, keeps what it had counted: the sums never go down);
- `tandem:gateway_replica_time_to_first_token_seconds{variant}`: the replicas' TTFT histograms
  added bucket by bucket (one code, one set of buckets; past replicas included);
- `tandem:gateway_replica_kv_cache_usage_perc{variant}`: the mean KV fraction in use over the live
  replicas; `..._num_requests_running{variant}` and `..._num_requests_waiting{variant}`: their sums.

Labels: the variant only, and only variants of the deployment (a replica of another variant is
ignored): the label set is closed, never a replica id or a model name.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import httpx
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from tandem.cluster.backend import Replica, ReplicaState

__all__ = ["ReplicaMetrics", "ReplicaSample", "parse_replica_metrics", "scrape_replica_metrics"]

logger = logging.getLogger("tandem.gateway")

PREFIX = "tandem:gateway_replica_"
_PREFIXES = ("tandem:", "vllm:")
_COUNTERS = ("prompt_tokens", "generation_tokens")
_GAUGES = ("kv_cache_usage_perc", "num_requests_running", "num_requests_waiting")
_TTFT = "time_to_first_token_seconds"


@dataclass
class ReplicaSample:
    """One replica's last values (summed over its label sets)."""

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    ttft_sum: float = 0.0

    def add(self, other: ReplicaSample) -> None:
        for name, value in other.counters.items():
            self.counters[name] = self.counters.get(name, 0.0) + value
        for le, count in other.ttft_buckets.items():
            self.ttft_buckets[le] = self.ttft_buckets.get(le, 0.0) + count
        self.ttft_sum += other.ttft_sum


def parse_replica_metrics(text: str) -> ReplicaSample:
    """The families this module aggregates, from a replica's Prometheus text (ValueError if it does not parse)."""
    sample = ReplicaSample()
    for family in text_string_to_metric_families(text):
        name = next((family.name[len(p) :] for p in _PREFIXES if family.name.startswith(p)), None)
        if name is not None and name.removesuffix("_total") in _COUNTERS:  # TYPE lines name it with or without
            name = name.removesuffix("_total")
            total = sum(s.value for s in family.samples if s.name.endswith("_total"))
            sample.counters[name] = sample.counters.get(name, 0.0) + total
        elif name in _GAUGES:
            sample.gauges[name] = sample.gauges.get(name, 0.0) + sum(s.value for s in family.samples)
        elif name == _TTFT:
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    sample.ttft_buckets[le] = sample.ttft_buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_sum"):
                    sample.ttft_sum += s.value
    return sample


def _went_back(old: ReplicaSample, new: ReplicaSample) -> bool:
    """A counter fell: the replica restarted (its process began again from zero)."""
    return any(new.counters.get(k, 0.0) < v for k, v in old.counters.items()) or any(
        new.ttft_buckets.get(le, 0.0) < c for le, c in old.ttft_buckets.items()
    )


class ReplicaMetrics:
    """The live replicas' last samples and the counted past of those gone, as a registry collector."""

    def __init__(self, registry: CollectorRegistry | None, variants: Callable[[], Iterable[str]]) -> None:
        self.variants = variants  # the deployment's variants now (the label set's bound)
        self.live: dict[str, tuple[str, ReplicaSample]] = {}  # replica id -> (variant, last sample)
        self.past: dict[str, ReplicaSample] = {}  # variant -> what replicas no longer live had counted
        if registry is not None:
            registry.register(self)

    def record(self, replica_id: str, variant: str, sample: ReplicaSample) -> None:
        if variant not in set(self.variants()):
            return
        old = self.live.get(replica_id)
        if old is not None and _went_back(old[1], sample):
            self.past.setdefault(old[0], ReplicaSample()).add(old[1])
        self.live[replica_id] = (variant, sample)

    def keep_only(self, replica_ids: Iterable[str]) -> None:
        """Replicas not among replica_ids are gone: their counts move to their variant's past."""
        keep = set(replica_ids)
        for replica_id in [r for r in self.live if r not in keep]:
            variant, sample = self.live.pop(replica_id)
            self.past.setdefault(variant, ReplicaSample()).add(sample)

    def describe(self) -> list[Metric]:
        return []  # no fixed series: collect() is the truth

    def collect(self) -> Iterator[Metric]:
        variants = sorted(set(self.variants()))
        counters = {
            name: CounterMetricFamily(
                PREFIX + name, f"The replicas' {name.replace('_', ' ')}, summed.", labels=["variant"]
            )
            for name in _COUNTERS
        }
        ttft = HistogramMetricFamily(
            PREFIX + _TTFT, "The replicas' time to first token, added bucket by bucket.", labels=["variant"]
        )
        kv = GaugeMetricFamily(
            PREFIX + "kv_cache_usage_perc", "Mean KV fraction in use, live replicas.", labels=["variant"]
        )
        running = GaugeMetricFamily(PREFIX + "num_requests_running", "Running on live replicas.", labels=["variant"])
        waiting = GaugeMetricFamily(PREFIX + "num_requests_waiting", "Waiting on live replicas.", labels=["variant"])
        for variant in variants:
            total = ReplicaSample()
            total.add(self.past.get(variant, ReplicaSample()))
            live = [s for v, s in self.live.values() if v == variant]
            for sample in live:
                total.add(sample)
            for name, family in counters.items():
                family.add_metric([variant], total.counters.get(name, 0.0))
            if total.ttft_buckets:
                buckets = sorted(total.ttft_buckets.items())
                ttft.add_metric(
                    [variant], [("+Inf" if math.isinf(le) else repr(le), c) for le, c in buckets], total.ttft_sum
                )
            kvs = [s.gauges["kv_cache_usage_perc"] for s in live if "kv_cache_usage_perc" in s.gauges]
            if kvs:
                kv.add_metric([variant], sum(kvs) / len(kvs))
            running.add_metric([variant], sum(s.gauges.get("num_requests_running", 0.0) for s in live))
            waiting.add_metric([variant], sum(s.gauges.get("num_requests_waiting", 0.0) for s in live))
        yield from counters.values()
        yield from (ttft, kv, running, waiting)


async def scrape_replica_metrics(
    metrics: ReplicaMetrics, replicas: list[Replica], client: httpx.AsyncClient | None, timeout_s: float
) -> int:
    """Read every ready or draining replica's metrics at once; record them. Returns how many answered."""
    polled = [r for r in replicas if r.state in (ReplicaState.READY, ReplicaState.DRAINING)]
    metrics.keep_only(r.replica_id for r in replicas)
    if client is None or not polled:
        return 0

    async def one(replica: Replica) -> ReplicaSample | None:
        engine = replica.spec.engine
        path = "/metrics" if engine is None else engine.metrics_path
        try:
            response = await client.get(replica.url + path, timeout=timeout_s)
            if response.status_code != 200:
                return None
            return await asyncio.to_thread(parse_replica_metrics, response.text)
        except httpx.HTTPError:
            return None
        except ValueError as exc:
            logger.warning("ignoring the metrics of %s: %s", replica.replica_id, exc)
            return None

    samples = await asyncio.gather(*(one(r) for r in polled))
    for replica, sample in zip(polled, samples, strict=True):
        if sample is not None:
            metrics.record(replica.replica_id, replica.variant, sample)
    return sum(s is not None for s in samples)
