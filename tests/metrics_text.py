"""Read a /metrics page into {(sample name, frozenset(labels)): value}."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["parse", "scrape", "total", "value"]

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(url: str, token: str | None = None) -> Samples:
    """A server's /metrics; `token`: the bearer a replica behind a gateway needs (the fleet secret)."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return parse(httpx.get(url + "/metrics", headers=headers, timeout=60).text)


def value(samples: dict, name: str, **labels: str) -> float:
    """The one sample named `name` whose labels include `labels` (0 when absent)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else 0.0


def total(samples: dict, name: str, keep=lambda labels: True) -> float:
    """The sum of the samples named `name` whose labels (a dict) `keep` accepts."""
    return sum(v for (n, ls), v in samples.items() if n == name and keep(dict(ls)))
