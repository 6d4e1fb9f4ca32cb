"""The simulator's prefix block cache: LRU blocks, prefill charged only for what is not cached, room
shrinking with the running work, routers told what replicas hold, and `tandem sim --router`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tandem.cli import cli
from tandem.schedule.policies import StaticParams, make_policy
from tandem.schedule.policies.context import ScaleLimits
from tandem.schedule.routers import make_router
from tandem.schedule.variant import Variant
from tandem.sim.block_cache import BlockCache
from tandem.sim.replica import SimReplica, SimSequence
from tandem.sim.simulator import SimConfig, simulate
from tandem.sim.trace import TraceRequest, load_trace

from .test_replica import profile, run


def test_the_cache_holds_leading_runs_and_evicts_the_least_recently_used():
    cache = BlockCache(3)
    cache.use([1, 2, 3])
    assert cache.leading([1, 2, 3, 9]) == 3 and cache.leading([2, 3]) == 2 and cache.leading([9, 1]) == 0
    cache.use([1])  # 1 is now the most recently used
    cache.use([7, 8])  # room for 3: 2 goes, then 3
    assert 2 not in cache and 3 not in cache and cache.leading([1]) == 1 and len(cache) == 3
    cache.resize(1)
    assert len(cache) == 1 and cache.evicted == 4


def test_a_cached_prefix_is_not_prefilled_again():
    replica = SimReplica("r", profile(prefill=1000.0, kv_cache_tokens=100_000), block_tokens=100)
    first = SimSequence(0.0, 1000, 1, blocks=tuple(range(10)))
    replica.submit(first, 0.0)
    run(replica, 2.0)
    assert first.ttft_s == pytest.approx(1.0) and first.cached_tokens == 0
    again = SimSequence(2.0, 1050, 1, blocks=(*range(8), 42, 43, 44))  # shares 8 blocks, then differs
    replica.submit(again, 2.0)
    run_from(replica, 2.0, 4.0)
    assert again.cached_tokens == 800
    assert again.ttft_s == pytest.approx(0.25)  # 250 prompt tokens at 1000/s
    whole = SimSequence(4.0, 1000, 1, blocks=tuple(range(10)))
    replica.submit(whole, 4.0)
    run_from(replica, 4.0, 6.0)
    assert whole.cached_tokens == 999  # one token is always computed


def run_from(replica: SimReplica, start: float, until: float, dt: float = 0.5) -> None:
    now = start
    while now < until:
        replica.step(now, dt)
        now += dt


def test_a_busy_replica_keeps_fewer_blocks():
    replica = SimReplica("r", profile(kv_cache_tokens=2000), block_tokens=100)
    replica.submit(SimSequence(0.0, 1000, 1, blocks=tuple(range(10))), 0.0)
    run(replica, 2.0)
    assert len(replica.prefix.cache) == 10
    replica.submit(SimSequence(2.0, 300, 1500, blocks=(50, 51, 52)), 2.0)  # 1800 tokens outside the cache
    replica.step(2.0, 0.1)
    assert replica.prefix.cache.capacity == 2 and len(replica.prefix.cache) == 2


def trace_sharing_prefixes(n: int = 160) -> list[TraceRequest]:
    """Twelve 'system prompts' of 8 blocks each, every request adding 2 blocks of its own."""
    return [
        TraceRequest(i * 0.25, 1000, 20, (*(1000 * (i % 12) + b for b in range(8)), 10**6 + 2 * i, 10**6 + 2 * i + 1))
        for i in range(n)
    ]


@pytest.mark.parametrize("router", ["least-outstanding", "prefix-affinity", "kv-aware"])
def test_routers_that_know_the_prefix_hit_the_cache_more(router):
    p = profile(prefill=2000.0, slots=8, kv_cache_tokens=4000)  # a replica holds a third of the prefixes
    policy = make_policy("static-peak", StaticParams(4))
    config = SimConfig(warmup_s=0.0, prefix_block_tokens=100)
    result = simulate(trace_sharing_prefixes(), Variant("v", "r", profile=p), policy, ScaleLimits(4, 4),
                      make_router(router), config, duration_s=40.0)  # fmt: skip
    assert result.served == 160
    rate, ttft = result.prefix_hit_rate, result.quantile("ttft", 0.5)
    if router == "least-outstanding":  # every prefix visits every replica: the caches churn
        assert rate < 0.35 and ttft > 0.4
    else:  # 8 of 10 blocks shared: near 0.8 once each prefix stays on one replica
        assert rate > 0.6 and ttft < 0.2


def test_a_mooncake_trace_carries_its_block_ids_and_the_cli_compares_routers(tmp_path):
    lines = [{"timestamp": 250 * i, "input_length": 1500, "output_length": 10, "hash_ids": [i % 3, 10 + i % 3, 100 + i]}
             for i in range(40)]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    trace = load_trace(path)
    assert trace[1].blocks == (1, 11, 101) and trace[1].arrival_s == pytest.approx(0.25)
    prof = tmp_path / "p.json"
    prof.write_text(profile(prefill=5000.0, kv_cache_tokens=50_000).to_json())
    out = tmp_path / "out.json"
    args = ["sim", "--trace", str(path), "--variant", f"v={prof}", "--policies", "capacity"]
    result = CliRunner().invoke(
        cli, [*args, "--router", "least-outstanding,kv-aware", "--warmup-s", "0", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert [r["router"] for r in rows] == ["least-outstanding", "kv-aware"]
    assert all(0 <= r["prefix_hit_rate"] <= 1 for r in rows)
    bad = CliRunner().invoke(cli, ["sim", "--trace", str(path), "--variant", f"v={prof}", "--router", "nearest"])
    assert bad.exit_code != 0 and "unknown nearest" in bad.output
