"""/metrics: vLLM's metric names with a tandem: prefix, labelled with model and recipe, moving with traffic.
SequenceTimer's bookkeeping on a hand-driven clock."""

from __future__ import annotations

import httpx
from metrics_text import scrape, value

from tandem.serve.metrics import ServerMetrics

from .conftest import MODEL_NAME

LABELS = {"model_name": MODEL_NAME, "recipe": "baseline"}
EXPECTED = [
    "tandem:num_requests_running",
    "tandem:num_requests_waiting",
    "tandem:time_to_first_token_seconds_count",
    "tandem:inter_token_latency_seconds_count",
    "tandem:e2e_request_latency_seconds_count",
    "tandem:prompt_tokens_total",
    "tandem:generation_tokens_total",
    "tandem:request_success_total",
    "tandem:spec_decode_num_draft_tokens_total",
    "tandem:spec_decode_num_accepted_tokens_total",
]


def test_every_metric_is_exported_with_model_and_recipe_labels(server):
    samples = scrape(server.url)
    names = {name for name, labels in samples if LABELS.items() <= dict(labels).items()}
    assert set(EXPECTED) <= names


def test_counters_and_histograms_follow_a_request(server):
    before = scrape(server.url)
    body = {"model": MODEL_NAME, "prompt": "def add", "max_tokens": 7, "temperature": 0, "ignore_eos": True}
    usage = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["usage"]
    after = scrape(server.url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **LABELS, **labels) - value(before, name, **LABELS, **labels)

    assert delta("tandem:generation_tokens_total") == 7
    assert delta("tandem:prompt_tokens_total") == usage["prompt_tokens"]
    assert delta("tandem:request_success_total", finished_reason="length") == 1
    assert delta("tandem:time_to_first_token_seconds_count") == 1
    assert delta("tandem:inter_token_latency_seconds_count") == 6  # 7 tokens, one step each: 6 gaps
    assert delta("tandem:e2e_request_latency_seconds_count") == 1
    assert value(after, "tandem:num_requests_running", **LABELS) == 0


def test_sequence_timer_observes_ttft_gaps_and_end_once():
    metrics = ServerMetrics()
    metrics.bind("m", "r", engine_stats=lambda: None)
    timer = metrics.timer(arrival=10.0)
    for now in (10.5, 10.75, 11.0):
        timer.on_tokens(now)
    timer.on_finish("stop", 11.0)
    timer.on_finish("abort", 12.0)  # a second end (the stream closing after it finished) is ignored

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"model_name": "m", "recipe": "r", **labels})

    assert sample("tandem:time_to_first_token_seconds_sum") == 0.5
    assert sample("tandem:inter_token_latency_seconds_count") == 2
    assert sample("tandem:inter_token_latency_seconds_sum") == 0.5
    assert sample("tandem:e2e_request_latency_seconds_sum") == 1.0
    assert sample("tandem:request_success_total", finished_reason="stop") == 1
    assert sample("tandem:request_success_total", finished_reason="abort") == 0
