"""judge(): four verdicts combined, fail closed, every number in the record."""

import json
from dataclasses import replace

from tandem.gate.config import GateConfig
from tandem.gate.evidence import Evidence, judge
from tandem.gate.sides import Side
from tandem.gate.verdict import Verdict, worst

from .helpers import agreeing, latency_pairs, obs, profile

CONFIG = GateConfig(candidate="fast", min_latency_samples=40, min_accuracy_samples=30, min_error_samples=20)
BASE, FAST = profile("baseline"), profile("fast", {1: 80.0, 4: 300.0, 16: 900.0, 32: 1200.0})


def good_pairs(n=40, slowdown=0.5):
    out = []
    for timed, scored in zip(latency_pairs(n, slowdown, seed=5), (agreeing(i, 20, 20) for i in range(n)), strict=True):
        out.append(replace(timed, agreement=scored.agreement))
    return out


def evidence(pairs, inc=BASE, cand=FAST, **kwargs):
    return Evidence(Side("baseline", inc), Side("fast", cand, **kwargs), tuple(pairs))


def test_all_four_pass():
    got = judge(evidence(good_pairs()), CONFIG)
    assert got.verdict is Verdict.PASS, got.reasons
    assert got.reasons[-1] == "fast passed latency, accuracy and cost against baseline"
    json.dumps(got.to_dict())  # every number is JSON-able, for the record


def test_one_failure_fails_the_gate_and_names_it():
    got = judge(evidence(good_pairs(), usd_per_hour=5.0), CONFIG)
    assert got.verdict is Verdict.FAIL and got.metrics["cost"].verdict is Verdict.FAIL
    assert got.reasons[-1] == "fast failed cost; baseline stays"


def test_candidate_errors_fail_the_gate_even_when_the_rest_passes():
    pairs = good_pairs()
    pairs[:3] = [replace(p, candidate=obs(error="HTTP 500", status=500), agreement=None) for p in pairs[:3]]
    assert judge(evidence(pairs), CONFIG).verdict is Verdict.FAIL


def test_missing_evidence_is_inconclusive_never_pass():
    got = judge(evidence(good_pairs(), cand=None), CONFIG)
    assert got.verdict is Verdict.INCONCLUSIVE and got.reasons[-1].startswith("not enough evidence yet on cost")
    assert judge(evidence([]), CONFIG).verdict is Verdict.INCONCLUSIVE


def test_worst():
    assert worst([Verdict.PASS, Verdict.INCONCLUSIVE]) is Verdict.INCONCLUSIVE
    assert worst([Verdict.INCONCLUSIVE, Verdict.FAIL, Verdict.PASS]) is Verdict.FAIL
    assert worst([]) is Verdict.INCONCLUSIVE
