"""The latency verdict on synthetic pairs with known answers, and its power at the documented size.

The synthetic model (tests/gate/helpers.py: latency_pairs): each request has a level both variants
share (lognormal, sd 0.5: prompt lengths and the load at that moment differ a lot between
requests), times each variant's own noise (lognormal, sd 0.15, so per-request log-ratios spread
with sd 0.21); the candidate is multiplied by the slowdown. At the default 100 pairs:
- a 10% slowdown FAILS in at least 90% of seeded trials (measured: 100 of 100 offline, 99 of 100
  at the live gate's per-look confidence, 99.2%);
- equal distributions FAIL in at most 5% of them (measured: 2 of 100 offline, 1 of 100 live);
  most are INCONCLUSIVE (PASS: 8 of 100 offline): proving "not 5% slower" needs more pairs.
"""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from tandem.gate.config import GateConfig
from tandem.gate.latency import harrell_davis, judge_latency, judge_statistic, latency_samples
from tandem.gate.pairs import PairLog
from tandem.gate.sides import Side
from tandem.gate.state import Gate
from tandem.gate.stats import Bound
from tandem.gate.verdict import Verdict

from .helpers import latency_pairs, obs, pair

DEFAULTS = GateConfig(candidate="c")
TRIALS = 100


def live_look_config() -> GateConfig:
    gate = Gate(DEFAULTS, incumbent=Side("i"), candidate=Side("c"), pairs=PairLog(), started_at=0.0)
    return gate.look_config


def verdicts(slowdown: float, config: GateConfig) -> Counter:
    n = config.min_latency_samples
    return Counter(judge_latency(latency_pairs(n, slowdown, seed), config).verdict for seed in range(TRIALS))


@pytest.mark.parametrize("config", [DEFAULTS, live_look_config()], ids=["offline", "live-look"])
def test_a_ten_percent_slowdown_fails_with_at_least_90_percent_power(config):
    got = verdicts(1.10, config)
    assert got[Verdict.FAIL] >= 0.9 * TRIALS, got
    assert got[Verdict.PASS] == 0, got


@pytest.mark.parametrize("config", [DEFAULTS, live_look_config()], ids=["offline", "live-look"])
def test_equal_distributions_fail_at_most_5_percent_of_the_time(config):
    got = verdicts(1.0, config)
    assert got[Verdict.FAIL] <= 0.05 * TRIALS, got


def test_a_clearly_faster_candidate_passes_and_a_clearly_slower_one_fails_with_few_pairs():
    config = replace(DEFAULTS, min_latency_samples=20)
    assert judge_latency(latency_pairs(20, 0.6, seed=1), config).verdict is Verdict.PASS
    assert judge_latency(latency_pairs(20, 2.0, seed=1), config).verdict is Verdict.FAIL


def test_too_few_pairs_is_inconclusive_whatever_they_say():
    got = judge_latency(latency_pairs(99, 3.0, seed=0), DEFAULTS)
    assert got.verdict is Verdict.INCONCLUSIVE and "fewer than the 100 required" in got.reasons[0]


def test_unusable_pairs_are_left_out():
    pairs = [
        pair(0, obs(ttft=0.1, tpot=0.01), obs(ttft=0.2, tpot=None)),  # one token: no TPOT
        pair(1, obs(ttft=0.1), obs(ttft=float("nan"))),
        pair(2, obs(ttft=0.1), obs(ttft=0.0)),
        pair(3, obs(ttft=0.1), obs(ttft=0.2, error="HTTP 500")),
        pair(4, obs(ttft=0.1, tpot=0.01), obs(ttft=0.3, tpot=0.02)),
    ]
    inc, cand = latency_samples(pairs, "ttft")
    assert list(inc) == [0.1, 0.1] and list(cand) == [0.2, 0.3]
    inc, cand = latency_samples(pairs, "tpot")
    assert list(cand) == [0.02, 0.02, 0.02]  # pair 0 had one token, pair 3 failed


@pytest.mark.parametrize(
    "estimate, low, high, expected",
    [
        (0.0, -0.03, 0.03, Verdict.PASS),  # within 5% with confidence
        (0.09, 0.02, 0.15, Verdict.FAIL),  # surely slower, by ~9.4%
        (0.03, 0.01, 0.06, Verdict.INCONCLUSIVE),  # surely slower, but by less than the tolerance
        (0.06, -0.01, 0.12, Verdict.INCONCLUSIVE),  # maybe slower
        (0.0, float("-inf"), float("inf"), Verdict.INCONCLUSIVE),
    ],
)
def test_the_decision_rule(estimate, low, high, expected):
    assert judge_statistic(Bound(estimate, low, high), 0.05)[0] is expected


def test_harrell_davis_p95():
    values = np.random.default_rng(0).lognormal(0, 1, 20_000)
    assert harrell_davis(values, 0.95) == pytest.approx(np.exp(1.6449), rel=0.03)
    batch = np.stack([np.arange(1.0, 101.0), np.arange(2.0, 202.0, 2)])
    got = harrell_davis(batch, 0.5)
    assert got[1] == pytest.approx(2 * got[0]) and got[0] == pytest.approx(50.5, rel=0.01)


def test_the_numbers_behind_the_verdict():
    got = judge_latency(latency_pairs(30, 1.5, seed=3), replace(DEFAULTS, min_latency_samples=30))
    ttft = got.stats["ttft"]
    assert ttft["samples"] == 30 and ttft["median"]["ratio"] == pytest.approx(1.5, rel=0.15)
    assert ttft["median"]["low"] < ttft["median"]["ratio"] < ttft["median"]["high"]
    assert ttft["candidate_p50_s"] > ttft["incumbent_p50_s"]
