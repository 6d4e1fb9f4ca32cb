"""The metrics adapters: an external engine's Prometheus text -> ReplicaLoad, on recorded texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.schedule.engine_loads import ADAPTERS, load_from_metrics, metric_samples

FIXTURES = Path(__file__).parents[1] / "fixtures" / "metrics"


def load(adapter: str, fixture: str):
    text = (FIXTURES / fixture).read_text()
    return load_from_metrics(adapter, text, replica_id="r-1", region="eu", variant="gpu")


@pytest.mark.parametrize(
    ("adapter", "fixture", "running", "waiting", "kv_used"),
    [
        ("vllm", "vllm.txt", 7, 3, 0.4375),
        ("vllm", "vllm-v0.txt", 12, 5, 0.92),  # before vLLM 0.10: gpu_cache_usage_perc
        ("sglang", "sglang.txt", 9, 2, 0.28),
        ("llamacpp", "llamacpp.txt", 4, 1, 0.0),  # today's llama-server has no KV gauge
        ("llamacpp", "llamacpp-2024.txt", 2, 0, 0.65),
    ],
)
def test_each_adapter_reads_its_engines_gauges(adapter, fixture, running, waiting, kv_used):
    got = load(adapter, fixture)
    assert (got.running, got.waiting, got.kv_used) == (running, waiting, pytest.approx(kv_used))
    assert (got.replica_id, got.region, got.variant, got.healthy, got.source) == ("r-1", "eu", "gpu", True, adapter)


def test_series_of_several_engines_are_summed():
    text = (FIXTURES / "vllm.txt").read_text()
    second = text.replace('engine="0"', 'engine="1"')
    got = load_from_metrics("vllm", text + second, replica_id="r", region="x", variant="v")
    assert (got.running, got.waiting) == (14, 6)
    assert got.kv_used == 0.4375  # each engine's own fraction: their mean


def test_the_wrong_adapter_is_refused_naming_the_missing_gauge():
    with pytest.raises(ValueError, match=r"no sglang:num_running_reqs .*sglang server"):
        load("sglang", "vllm.txt")


def test_text_that_is_not_prometheus_is_refused():
    with pytest.raises(ValueError):
        load_from_metrics("vllm", '{"error": "not found"}', replica_id="r", region="x", variant="v")


def test_unknown_adapter_is_refused():
    with pytest.raises(ValueError, match="no metrics adapter 'tgi'"):
        load_from_metrics("tgi", "", replica_id="r", region="x", variant="v")


def test_every_adapter_has_its_three_names_and_none_is_not_one():
    assert set(ADAPTERS) == {"vllm", "sglang", "llamacpp"}
    assert metric_samples('# TYPE a gauge\na 1\na{x="y"} 2\n') == {"a": [1.0, 2.0]}
