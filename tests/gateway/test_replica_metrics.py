"""The replicas' token, TTFT and KV series on the gateway's /metrics, per variant (a FakeBackend's
replicas answering GET /metrics through an httpx MockTransport): sums and a bucket-wise TTFT
histogram; a replica that leaves or restarts keeps what it counted; only the deployment's variants."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from tandem.cluster.fake import FakeBackend
from tandem.deployment import parse_deployment
from tandem.gateway.replica_metrics import ReplicaMetrics, parse_replica_metrics, scrape_replica_metrics
from tandem.gateway.wiring import build_gateway


def replica_text(prompt: float, generated: float, kv: float, ttft: tuple[float, float, float]) -> str:
    """A replica's /metrics (tandem's names, as prometheus_client writes them): ttft = cumulative counts at
    le 0.1, 1.0, +Inf."""
    return f"""# TYPE tandem:prompt_tokens_total counter
tandem:prompt_tokens_total{{model_name="m",recipe="int8"}} {prompt}
# TYPE tandem:generation_tokens_total counter
tandem:generation_tokens_total{{model_name="m",recipe="int8"}} {generated}
# TYPE tandem:kv_cache_usage_perc gauge
tandem:kv_cache_usage_perc{{model_name="m",recipe="int8"}} {kv}
# TYPE tandem:num_requests_running gauge
tandem:num_requests_running{{model_name="m",recipe="int8"}} 2
# TYPE tandem:time_to_first_token_seconds histogram
tandem:time_to_first_token_seconds_bucket{{le="0.1",model_name="m",recipe="int8"}} {ttft[0]}
tandem:time_to_first_token_seconds_bucket{{le="1.0",model_name="m",recipe="int8"}} {ttft[1]}
tandem:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m",recipe="int8"}} {ttft[2]}
tandem:time_to_first_token_seconds_sum{{model_name="m",recipe="int8"}} 1.5
tandem:time_to_first_token_seconds_count{{model_name="m",recipe="int8"}} {ttft[2]}
"""


def value(text: str, series: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(series + " "))
    return float(line.rsplit(" ", 1)[1])


def test_the_gateway_aggregates_its_replicas_series_per_variant():
    texts = {"fast-1": replica_text(100, 40, 0.5, (1, 3, 4)), "fast-2": replica_text(50, 10, 0.25, (0, 2, 2))}
    transport = httpx.MockTransport(lambda r: httpx.Response(200, text=texts[r.url.host]))
    raw = {
        "variants": [{"name": "fast", "recipe": "int8", "replicas": {"min": 2, "max": 2}}],
        "policy": {"name": "hpa"},
    }
    gw = build_gateway(parse_deployment(raw), FakeBackend(clock=lambda: 0.0), transport=transport)
    gw.fleet.controller.tick()
    gw.fleet.controller.tick()
    client = gw.upstream.open()
    replicas = gw.fleet.backend.list()
    assert {r.replica_id for r in replicas} == {"fast-1", "fast-2"}

    async def scrape():
        return await scrape_replica_metrics(gw.replica_metrics, gw.fleet.backend.list(), client, 1.0)

    assert asyncio.run(scrape()) == 2
    out = generate_latest(gw.registry).decode()
    assert value(out, 'tandem:gateway_replica_prompt_tokens_total{variant="fast"}') == 150
    assert value(out, 'tandem:gateway_replica_generation_tokens_total{variant="fast"}') == 50
    assert value(out, 'tandem:gateway_replica_kv_cache_usage_perc{variant="fast"}') == 0.375
    assert value(out, 'tandem:gateway_replica_num_requests_running{variant="fast"}') == 4
    assert value(out, 'tandem:gateway_replica_time_to_first_token_seconds_bucket{le="1.0",variant="fast"}') == 5
    assert value(out, 'tandem:gateway_replica_time_to_first_token_seconds_count{variant="fast"}') == 6
    assert "fast-1" not in out and "model_name" not in out  # closed labels: the variant only


def test_a_replica_that_left_or_restarted_keeps_what_it_counted():
    metrics = ReplicaMetrics(CollectorRegistry(), lambda: ["fast"])
    metrics.record("fast-1", "fast", parse_replica_metrics(replica_text(100, 40, 0.5, (1, 3, 4))))
    metrics.record("fast-2", "fast", parse_replica_metrics(replica_text(50, 10, 0.25, (0, 2, 2))))
    metrics.record("fast-2", "fast", parse_replica_metrics(replica_text(5, 1, 0.1, (0, 1, 1))))  # restarted
    metrics.keep_only(["fast-2"])  # fast-1 left
    metrics.record("other-1", "other", parse_replica_metrics(replica_text(9, 9, 0.9, (1, 1, 1))))  # not deployed
    registry = CollectorRegistry()
    registry.register(metrics)
    out = generate_latest(registry).decode()
    assert value(out, 'tandem:gateway_replica_prompt_tokens_total{variant="fast"}') == 155
    assert value(out, 'tandem:gateway_replica_time_to_first_token_seconds_count{variant="fast"}') == 7
    assert value(out, 'tandem:gateway_replica_kv_cache_usage_perc{variant="fast"}') == 0.1  # live replicas only
    assert 'variant="other"' not in out
