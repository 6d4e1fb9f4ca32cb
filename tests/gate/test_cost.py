"""The unit-cost verdict from Profiles at the latency SLO and prices per replica-hour."""

import pytest

from tandem.gate.config import GateConfig
from tandem.gate.cost import judge_cost, variant_cost
from tandem.gate.sides import Side
from tandem.gate.verdict import Verdict
from tandem.schedule.policies.capacity import slo_capacity

from .helpers import profile

CONFIG = GateConfig(candidate="c", tpot_slo_s=0.1)
BASE = profile("baseline", {1: 50.0, 4: 180.0, 16: 500.0, 32: 700.0})
FAST = profile("int8", {1: 80.0, 4: 300.0, 16: 900.0, 32: 1200.0})


def test_the_cost_is_the_price_over_the_capacity_at_the_slo():
    cost = variant_cost(BASE, 0.36, 0.1)
    cap = slo_capacity(BASE, 0.1)  # the capacity policy's own reading of a Profile
    assert (cost.batch, cost.output_tokens_per_s) == (cap.batch, cap.output_tokens_per_s)
    assert cost.usd_per_million_tokens == pytest.approx(1e6 * 0.36 / (3600 * cap.output_tokens_per_s))


def test_a_faster_candidate_at_the_same_price_passes():
    got = judge_cost(Side("b", BASE), Side("f", FAST), CONFIG)
    assert got.verdict is Verdict.PASS and got.stats["ratio"] < 1


def test_a_dearer_candidate_fails_by_price_or_by_throughput():
    assert judge_cost(Side("b", BASE, 0.10), Side("f", FAST, 0.50), CONFIG).verdict is Verdict.FAIL
    slower = profile("slow", {1: 40.0, 4: 150.0, 16: 400.0, 32: 600.0})
    got = judge_cost(Side("b", BASE), Side("s", slower), CONFIG)
    assert got.verdict is Verdict.FAIL and "dearer than the incumbent" in got.reasons[-1]


def test_equal_cost_passes_and_the_tolerance_allows_a_little_more():
    assert judge_cost(Side("b", BASE), Side("b2", BASE), CONFIG).verdict is Verdict.PASS
    dearer = Side("f", BASE, usd_per_hour=0.1026 * 1.04)
    assert judge_cost(Side("b", BASE), dearer, CONFIG).verdict is Verdict.FAIL
    loose = GateConfig(candidate="c", cost_tolerance=0.05)
    assert judge_cost(Side("b", BASE), dearer, loose).verdict is Verdict.PASS


def test_a_candidate_that_cannot_keep_the_slo_fails():
    hopeless = profile("slow", {1: 5.0, 2: 8.0})  # 200 ms per token even alone
    got = judge_cost(Side("b", BASE), Side("s", hopeless, usd_per_hour=0.001), CONFIG)
    assert got.verdict is Verdict.FAIL and "cannot keep the SLO" in got.reasons[-1]


def test_without_profiles_it_is_inconclusive_and_says_why():
    got = judge_cost(Side("b", BASE), Side("x", None, profile_error="measuring failed: boom"), CONFIG)
    assert got.verdict is Verdict.INCONCLUSIVE
    assert got.reasons == ("no measured Profile for the candidate (measuring failed: boom)",)


def test_profiles_from_different_hardware_are_flagged():
    other = profile("int8", {1: 80.0, 32: 1200.0}, hardware="h100-80gb")
    assert any("different hardware" in r for r in judge_cost(Side("b", BASE), Side("f", other), CONFIG).reasons)
