"""/metrics: vLLM's metric names with a tandem: prefix (or vLLM's own), labelled with model and recipe,
moving with traffic; HTTP responses by status; no `_created` series. SequenceTimer's bookkeeping on a
hand-driven clock."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient
from metrics_text import parse, scrape, value
from prometheus_client.parser import text_string_to_metric_families

from tandem.edge.prometheus import METHODS
from tandem.edge.settings import Settings
from tandem.engine import RequestMetrics
from tandem.serve import create_app, load_served_model
from tandem.serve.metrics import ServerMetrics, token_buckets

from .conftest import API_KEY, MODEL_NAME

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
    "tandem:prefix_cache_queries_total",
    "tandem:prefix_cache_hits_total",
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


def test_prefix_cache_counters_count_tokens_as_vllm_does(server):
    prompt = "def sum_of_squares(values):\n    total = 0\n    for value in values:\n        total += value * value\n"
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    before = scrape(server.url)
    first = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["usage"]["prompt_tokens"]
    httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    after = scrape(server.url)

    def delta(name: str) -> float:
        return value(after, name, **LABELS) - value(before, name, **LABELS)

    assert first > 32 and delta("tandem:prefix_cache_queries_total") == 2 * first
    assert delta("tandem:prompt_tokens_total") == 2 * first  # cached tokens count as prompt tokens too
    # The second request reused the first one's full 16-token blocks (never its last token).
    assert delta("tandem:prefix_cache_hits_total") == min(first - 1, (first // 16) * 16)


def test_sequence_timer_observes_ttft_gaps_phases_and_end_once():
    metrics = ServerMetrics()
    metrics.bind("m", "r", 1024, engine_stats=lambda: None)
    timer = metrics.timer(arrival=10.0)
    for now in (10.5, 10.75, 11.0):
        timer.on_tokens(now)
    engine = RequestMetrics(arrival_time=10.0, first_scheduled_time=10.125, first_token_time=10.5, last_token_time=11.0)
    timer.on_finish("stop", 11.0, engine, prompt_tokens=7, generation_tokens=3)
    timer.on_finish("abort", 12.0)  # a second end (the stream closing after it finished) is ignored

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"model_name": "m", "recipe": "r", **labels})

    assert sample("tandem:time_to_first_token_seconds_sum") == 0.5
    assert sample("tandem:inter_token_latency_seconds_count") == 2
    assert sample("tandem:inter_token_latency_seconds_sum") == 0.5
    assert sample("tandem:e2e_request_latency_seconds_sum") == 1.0
    assert sample("tandem:request_success_total", finished_reason="stop") == 1
    assert sample("tandem:request_success_total", finished_reason="abort") == 0
    assert sample("tandem:request_queue_time_seconds_sum") == 0.125
    assert sample("tandem:request_prefill_time_seconds_sum") == 0.375
    assert sample("tandem:request_decode_time_seconds_sum") == 0.5
    assert sample("tandem:request_inference_time_seconds_sum") == 0.875
    assert sample("tandem:request_prompt_tokens_sum") == 7
    assert sample("tandem:request_prompt_tokens_bucket", le="5.0") == 0
    assert sample("tandem:request_prompt_tokens_bucket", le="10.0") == 1
    assert sample("tandem:request_generation_tokens_sum") == 3


def test_token_buckets_are_vllms_1_2_5_series_up_to_the_context():
    assert token_buckets(1024) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    assert token_buckets(2) == (1, 2)


def test_an_unknown_prefix_is_refused():
    with pytest.raises(ValueError, match="metrics prefix"):
        ServerMetrics("sglang")


# Every family issue 14 names (vLLM's names), and those tandem had before, under either prefix, as the
# parser names families (counters without their _total; iteration_tokens_total is a histogram).
FAMILIES = [
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "prompt_tokens",
    "generation_tokens",
    "request_success",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_inference_time_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "iteration_tokens_total",
]
KEY = "metrics-key"


@pytest.mark.parametrize("prefix", ["tandem", "vllm"])
def test_metrics_page_lists_every_family_under_the_prefix_and_counts_http_statuses(prefix, tiny_llama_dir):
    """A real app (the tiny model, speculating with ngram), requests through it; then /metrics."""
    config = Settings(
        recipe="ngram", model=str(tiny_llama_dir), served_model_name="tiny", max_model_len=64, max_num_seqs=2,
        threads=1, api_key=KEY, max_body_bytes=512, metrics_prefix=prefix,
    )  # fmt: skip
    app = create_app(config, lambda: load_served_model(config, created=0))
    auth = {"Authorization": f"Bearer {KEY}"}
    with TestClient(app) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        prompt = "a b c a b c a b c a b c"
        ok = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        assert client.post("/v1/completions", json=ok, headers=auth).status_code == 200
        assert client.post("/v1/completions", json=ok).status_code == 401  # refused by the auth middleware
        assert client.post("/v1/completions", json={**ok, "max_tokens": -1}, headers=auth).status_code == 400
        big = {**ok, "prompt": "x" * 1000}
        assert client.post("/v1/completions", json=big, headers=auth).status_code == 413  # by the body middleware
        assert client.get("/v1/no-such-route", headers=auth).status_code == 404
        text = client.get("/metrics").text

    name = f"{prefix}:"
    families = {family.name for family in text_string_to_metric_families(text)}
    missing = [f for f in FAMILIES if name + f not in families]
    assert not missing, f"families missing under {name}: {missing}"
    other = "tandem:" if prefix == "vllm" else "vllm:"
    assert not any(f.startswith(other) for f in families)
    assert "_created" not in text

    samples = parse(text)
    labels = {"model_name": "tiny", "recipe": "ngram"}
    assert value(samples, name + "generation_tokens_total", **labels) == 8
    assert value(samples, name + "request_generation_tokens_count", **labels) == 1
    assert value(samples, name + "request_prompt_tokens_sum", **labels) > 0
    assert value(samples, name + "request_queue_time_seconds_count", **labels) == 1
    assert value(samples, name + "request_prefill_time_seconds_count", **labels) == 1
    assert value(samples, name + "request_decode_time_seconds_count", **labels) == 1
    # Every step's tokens: the prompt's prefill steps and the decode steps, 8 tokens generated in all.
    prompt_tokens = value(samples, name + "prompt_tokens_total", **labels)
    assert value(samples, name + "iteration_tokens_total_sum", **labels) == prompt_tokens + 8
    assert value(samples, name + "kv_cache_usage_perc", **labels) == 0  # nothing runs now
    drafts = value(samples, name + "spec_decode_num_drafts_total", **labels)
    drafted = value(samples, name + "spec_decode_num_draft_tokens_total", **labels)
    accepted = value(samples, name + "spec_decode_num_accepted_tokens_total", **labels)
    assert 0 < drafts <= drafted and accepted <= drafted
    per_position = [v for (n, _), v in samples.items() if n == name + "spec_decode_num_accepted_tokens_per_pos_total"]
    assert sum(per_position) == accepted

    http = name + "http_requests_total" if prefix == "tandem" else "http_requests_total"
    for status in ("200", "401", "400", "413"):
        assert value(samples, http, handler="/v1/completions", method="POST", status=status) == 1, status
    assert value(samples, http, handler="none", method="GET", status="404") == 1
    assert value(samples, http, handler="/ready") == 0  # probes are not counted


def test_thousands_of_distinct_methods_and_paths_leave_the_series_count_unchanged(guarded_server):
    """Labels come from closed sets: route templates (or "none"), methods from a fixed list (or
    "other"), 401s included; 5,000 distinct methods and paths, with and without the key, add no series."""
    url, auth = guarded_server.url, {"Authorization": f"Bearer {API_KEY}"}

    def requests(count: int, offset: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            for i in range(offset, offset + count):
                method = ("GET", "DELETE", f"PROBE{i}", "PATCH")[i % 4]
                path = (f"/v1/models/m{i}", f"/v1/x/{i}", f"/nothing/{i}", f"/tokenize/{i}")[(i // 4) % 4]
                client.request(method, path, headers=auth if i % 2 else None)

    requests(64, 0)  # every combination once: the closed set's series exist
    before = scrape(url)
    with ThreadPoolExecutor(4) as pool:  # 5,000 more, on four connections
        list(pool.map(lambda k: requests(1_250, 64 + k * 1_250), range(4)))
    after = scrape(url)
    assert len(after) == len(before), sorted({k for k in after} - {k for k in before})[:10]
    handlers = {dict(labels).get("handler") for name, labels in after if name == "tandem:http_requests_total"}
    methods = {dict(labels).get("method") for name, labels in after if name == "tandem:http_requests_total"}
    assert not any(h.startswith(("/v1/models/m", "/v1/x/", "/nothing/", "/tokenize/")) for h in handlers), handlers
    assert "/v1/models/{model_id:path}" in handlers and "none" in handlers
    assert methods <= METHODS | {"other"} and "other" in methods and not any("PROBE" in m for m in methods)
    counted = sum(v for (name, _), v in after.items() if name == "tandem:http_requests_total")
    assert counted >= 5_064
