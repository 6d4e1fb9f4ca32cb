"""InFlight (the gateway's counts as ReplicaLoads) and DemandMeter (tokens/s over a sliding window)."""

from __future__ import annotations

import pytest

from tandem.cluster import FakeBackend, ReplicaSpec
from tandem.schedule.policies import TokenDemand
from tandem.schedule.traffic import DemandMeter, InFlight

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
    assert meter.rate("v", 15.0) == TokenDemand()
