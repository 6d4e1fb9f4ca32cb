"""Read a /metrics page into {(sample name, frozenset(labels)): value}."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["scrape", "value"]


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(url + "/metrics", timeout=60).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    """The one sample named `name` whose labels include `labels` (0 when absent)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else 0.0
