"""Every model's metrics on the gateway's one /metrics page, each series labelled with its `model`.

Each model's pieces (its SchedulerMetrics, GatewayMetrics, its gate's metrics) write to a registry
of their own, exactly as one model's do; `ModelLabelled` collects them all into the gateway's
registry, adding `model="<name>"` to every sample. The label's values are the names in the
deployment file, a closed set: a client's `model` text never becomes a label (a request for an
unknown model is answered 404 before anything is counted under a model).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

__all__ = ["MODEL_LABEL", "ModelLabelled"]

MODEL_LABEL = "model"


class ModelLabelled(Collector):
    def __init__(self, registries: Mapping[str, CollectorRegistry]) -> None:
        self.registries = dict(registries)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for model, registry in self.registries.items():
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                merged.samples.extend(
                    Sample(s.name, {**s.labels, MODEL_LABEL: model}, s.value, s.timestamp, s.exemplar)
                    for s in family.samples
                )
        yield from families.values()

    def describe(self) -> list[Metric]:
        return []  # collected fresh on each scrape; nothing to check at registration
