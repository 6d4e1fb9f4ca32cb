"""Every policy on a synthetic burst, through the experiment runner: static-peak's count, capacity ahead of a
burst it has seen, no request lost by any of them, and every field of the JSON row."""

from __future__ import annotations

import pytest

from tandem.contracts import Profile
from tandem.schedule.packing import NodeShape
from tandem.sim.experiment import POLICY_NAMES, SimVariant, Slo, run_experiment, run_pair
from tandem.sim.simulator import SimConfig
from tandem.sim.sizing import peak_window, static_peak_replicas
from tandem.sim.trace import poisson_trace

PROFILE = Profile(
    recipe="sim", hardware="sim", model="sim", weight_bytes=40 * 2**30, kv_bytes_per_token=2**20, max_slots=64,
    decode_tokens_per_s={1: 50.0, 8: 320.0, 32: 800.0, 64: 1100.0}, prefill_tokens_per_s=20000.0, ttft_s_p50=0.1,
    cold_start_s=30.0, max_model_len=4096,
)  # fmt: skip
VARIANT = SimVariant("v", PROFILE, usd_per_hour=2.0)
SLO = Slo(ttft_s=2.0, tpot_s=0.1)
CONFIG = SimConfig(warmup_s=120)
ROW_FIELDS = {
    "variant", "policy", "profile_source", "profile_source_note", "replica_hours", "replica_hours_per_day",
    "accelerator_hours_per_day", "peak_replicas", "mean_replicas", "min_replicas", "slo_attainment", "ttft_p50_s",
    "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "cost_usd", "cost_usd_per_day", "usd_per_million_output_tokens",
    "scale_events", "lost", "unserved", "served", "node_hours", "node_hours_per_day",
}  # fmt: skip


def burst_trace():
    """2 requests/s for 10 minutes, with two 10 s bursts at 10x, four minutes apart."""
    base = poisson_trace(2.0, 600, prompt=500, output=200, seed=1)
    first = poisson_trace(20.0, 10, prompt=500, output=200, seed=2, start_s=150)
    second = poisson_trace(20.0, 10, prompt=500, output=200, seed=3, start_s=390)
    return sorted(base + first + second, key=lambda r: r.arrival_s)


@pytest.fixture(scope="module")
def results():
    return {r.policy: r for r in run_experiment(burst_trace(), [VARIANT], POLICY_NAMES, SLO, duration_s=600,
                                                config=CONFIG)}  # fmt: skip


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_no_policy_loses_or_strands_a_request(results, policy):
    sim = results[policy].sim
    assert sim.lost == 0 and sim.unserved == 0 and sim.served == len(burst_trace())


def test_static_peak_holds_the_fewest_replicas_that_meet_the_slo_at_the_peak(results):
    trace = burst_trace()
    start, needed = peak_window(trace, PROFILE, SLO.tpot_s)
    assert 140 <= start <= 160 and needed > 1  # the peak minute holds the first burst
    sizing = static_peak_replicas(trace, VARIANT.variant(), CONFIG, SLO.target)
    assert sizing.meets_slo and sizing.attainment >= SLO.target
    fewer = static_peak_replicas(trace, VARIANT.variant(), CONFIG, target=1.01)  # unreachable: the best count
    assert not fewer.meets_slo and fewer.replicas >= sizing.replicas
    sim = results["static-peak"].sim
    assert sim.min_live == sim.max_live == sizing.replicas == results["static-peak"].setup["replicas"]
    assert sim.decisions["up"] == sim.decisions["down"] == 0


def test_capacity_is_ready_for_the_second_burst_before_it_comes(results):
    def ready_at(policy: str, t: float) -> int:
        return next(ready for at, _, ready in results[policy].sim.timeline if at >= t)

    def second_burst(policy: str) -> float:
        sim = results[policy].sim
        inside = [r for r in sim.requests if 390 <= r.arrival_s < 400]
        return sum(1 for r in inside if sim.meets_slo(r)) / len(inside)

    assert ready_at("capacity", 148) == 1  # the first burst comes unannounced ...
    assert ready_at("capacity", 388) >= 3  # ... the second finds the room it needs waiting (10 s x 4 / 11 s)
    assert ready_at("kpa", 388) == 1  # a reactive policy has let it go by then
    assert second_burst("capacity") >= 0.99 > second_burst("kpa")
    # capacity v2: the unannounced first burst costs 13% of the requests, so the attainment feedback raises the
    # headroom (by design) and square-root staffing adds its margin: within 25% of static-peak's cost here, no
    # longer below it (v1 asserted below; see docs/planner.md).
    assert results["capacity"].sim.replica_seconds < 1.25 * results["static-peak"].sim.replica_seconds


def test_every_row_has_the_fields_of_the_json(results):
    row = results["capacity"].row()
    assert ROW_FIELDS <= set(row)
    assert row["replica_hours_per_day"] == pytest.approx(row["replica_hours"] * 86400 / 600)
    assert row["cost_usd"] == pytest.approx(2.0 * row["replica_hours"])
    assert row["usd_per_million_output_tokens"] == pytest.approx(row["cost_usd"] / row["output_tokens"] * 1e6)
    assert row["profile_source"] == "measured" and row["node_hours"] is None


def test_packing_reports_node_hours():
    node = NodeShape(100 * 2**30)  # a replica: 40 GiB of weights + 64 x 4096 x 1 MiB of KV = 296 GiB: too big
    with pytest.raises(ValueError, match="more than one node"):
        run_pair(burst_trace(), VARIANT, "static-peak", SLO, duration_s=600, config=CONFIG, node=node)
    big = NodeShape(700 * 2**30)  # two replicas per node
    result = run_pair(burst_trace(), VARIANT, "static-peak", SLO, duration_s=600, config=CONFIG, node=big)
    row = result.row()
    assert result.setup["node"]["replicas_per_node"] == 2
    assert row["node_hours"] == pytest.approx(-(-row["peak_replicas"] // 2) * 600 / 3600)


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        run_experiment(burst_trace(), [VARIANT], ["vpa"], SLO)
