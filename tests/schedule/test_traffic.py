"""InFlight (replicas' own reports refreshed by the gateway's counts, as ReplicaLoads) and DemandMeter."""

from __future__ import annotations

import pytest

from tandem.cluster import FakeBackend, ReplicaSpec
from tandem.contracts import ReplicaLoad
from tandem.schedule.policies import TokenDemand
from tandem.schedule.traffic import DemandMeter, InFlight, LoadReport, estimate

from .helpers import FakeClock


def test_inflight_loads_reflect_begin_end_state_and_reachability():
    clock = FakeClock()
    backend = FakeBackend(clock, startup_s=1.0)
    a = backend.start(ReplicaSpec(variant="v", recipe="r", region="eu"))
    b = backend.start(ReplicaSpec(variant="v", recipe="r"))
    inflight = InFlight(clock, unreachable_s=2.0)
    inflight.begin(a.replica_id)
    inflight.begin(a.replica_id)
    loads = inflight.loads(backend.list())
    assert loads[a.replica_id].running == 2 and loads[a.replica_id].region == "eu"
    assert not loads[a.replica_id].healthy  # still starting
    clock.advance(1.0)
    backend.health(a.replica_id), backend.health(b.replica_id)
    inflight.mark_unreachable(b.replica_id)
    loads = inflight.loads(backend.list())
    assert loads[a.replica_id].healthy and not loads[b.replica_id].healthy
    clock.advance(2.0)
    assert inflight.loads(backend.list())[b.replica_id].healthy
    inflight.end(a.replica_id)
    inflight.end(a.replica_id)
    assert inflight.running == {}


def test_demand_meter_rates_over_the_window():
    meter = DemandMeter(window_s=10.0)
    assert meter.rate("v", 0.0) == TokenDemand()
    meter.record("v", 1.0, prompt_tokens=100, output_tokens=50)
    meter.record("v", 5.0, prompt_tokens=300, output_tokens=150)
    meter.record("w", 5.0, prompt_tokens=1)
    rate = meter.rate("v", 9.0)
    assert rate.prompt_tokens_per_s == pytest.approx(40.0) and rate.output_tokens_per_s == pytest.approx(20.0)
    assert rate.requests_per_s == pytest.approx(0.2)
    assert meter.rate("v", 11.0).output_tokens_per_s == pytest.approx(15.0)  # the t=1 event left the window
    # the window is empty; the short tail of the outputs is a count of recent requests, it outlives the window
    assert meter.rate("v", 15.0) == TokenDemand(short_output_tokens=50.0)


def test_demand_meter_keeps_the_short_tail_of_the_outputs_judged_on_tpot():
    meter = DemandMeter(window_s=10.0, lengths_kept=20, length_quantile=0.1)
    for i in range(40):  # outputs 1 .. 40; a one-token answer has no TPOT and is not kept
        meter.record("v", float(i) / 10, prompt_tokens=100, output_tokens=i + 1)
    assert meter.rate("v", 4.0).short_output_tokens == 23.0  # the last 20 kept (21 .. 40): rank 2 of them
    meter.record("v", 4.0, prompt_tokens=0, output_tokens=5)  # streamed tokens without their prompt: not a request
    assert meter.rate("v", 4.0).short_output_tokens == 23.0
    with pytest.raises(ValueError):
        DemandMeter(length_quantile=0.7)


def test_demand_meter_totals_count_every_arrival_for_a_per_tick_difference():
    meter = DemandMeter(window_s=10.0)
    assert meter.rate("v", 0.0).arrived_requests_total is None  # never fed: unknown
    meter.arrive("v", 1.0, prompt_tokens=2000)
    meter.arrive("v", 2.0, prompt_tokens=1000)
    rate = meter.rate("v", 30.0)  # long after the window: the totals stay
    assert (rate.arrived_requests_total, rate.arrived_prompt_tokens_total) == (2, 3000)
    assert rate.arrived_requests_per_s == 0.0


def test_reported_loads_are_refreshed_by_the_gateways_own_counts_between_polls():
    clock = FakeClock()
    backend = FakeBackend(clock)
    a = backend.start(ReplicaSpec(variant="v", recipe="r"))
    backend.health(a.replica_id)
    inflight = InFlight(clock, report_max_age_s=5.0)
    inflight.begin(a.replica_id)  # 1 of ours in flight when it reports
    inflight.report(ReplicaLoad(a.replica_id, "local", "v", running=4, waiting=2, kv_used=0.5, healthy=True))
    load = inflight.loads(backend.list())[a.replica_id]
    assert (load.running, load.waiting, load.kv_used, load.healthy) == (4, 2, 0.5, True)  # others' requests count
    inflight.begin(a.replica_id)
    inflight.begin(a.replica_id)  # 2 more sent since the poll
    load = inflight.loads(backend.list())[a.replica_id]
    assert load.running + load.waiting == 8 and load.waiting == 2
    for _ in range(3):
        inflight.end(a.replica_id)  # all of ours finished: the others' 5 remain
    load = inflight.loads(backend.list())[a.replica_id]
    assert load.running + load.waiting == 5 and load.kv_used == 0.5
    clock.advance(5.1)  # the report is stale: the gateway's own count alone, KV use unknown
    load = inflight.loads(backend.list())[a.replica_id]
    assert (load.running, load.waiting, load.kv_used) == (0, 0, 0.0)


def test_a_replica_that_reports_itself_unhealthy_is_not_routable():
    clock = FakeClock()
    backend = FakeBackend(clock)
    a = backend.start(ReplicaSpec(variant="v", recipe="r"))
    backend.health(a.replica_id)
    inflight = InFlight(clock)
    inflight.report(ReplicaLoad(a.replica_id, "local", "v", running=0, waiting=0, kv_used=0.0, healthy=False))
    assert not inflight.loads(backend.list())[a.replica_id].healthy
    inflight.forget([])
    assert inflight.loads(backend.list())[a.replica_id].healthy


def test_estimate_never_counts_fewer_than_the_gateway_has_in_flight():
    replica = FakeBackend(FakeClock()).start(ReplicaSpec(variant="v", recipe="r"))
    report = LoadReport(ReplicaLoad(replica.replica_id, "local", "v", 0, 0, 0.0, True), at=0.0, inflight=3)
    assert estimate(replica, report, inflight=2, reachable=True).running == 2


def test_demand_meter_counts_arrivals_as_they_come_and_the_share_within_the_slo():
    meter = DemandMeter(window_s=10.0)
    meter.arrive("v", 1.0, prompt_tokens=2000)
    meter.arrive("v", 2.0, prompt_tokens=1000)
    meter.record("v", 3.0, prompt_tokens=2000, output_tokens=30, within_slo=True)
    meter.record("v", 4.0, prompt_tokens=1000, output_tokens=30, within_slo=False)
    rate = meter.rate("v", 5.0)
    assert rate.arrived_requests_per_s == pytest.approx(0.2)
    assert rate.arrived_prompt_tokens_per_s == pytest.approx(300.0)
    assert rate.slo_attainment == pytest.approx(0.5)
    later = meter.rate("v", 13.5)  # the arrivals left the window, the missed outcome is still in it
    assert later.arrived_requests_per_s == 0.0 and later.slo_attainment == 0.0
    plain = DemandMeter()
    plain.record("v", 1.0, 10, 10)
    assert plain.rate("v", 2.0).arrived_requests_per_s is None  # never fed: unknown, not zero
    assert plain.rate("v", 2.0).slo_attainment is None
