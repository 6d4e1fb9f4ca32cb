"""The accuracy verdict on synthetic evidence with known answers."""

from dataclasses import replace

from tandem.gate.accuracy import judge_accuracy
from tandem.gate.config import GateConfig
from tandem.gate.verdict import Verdict

from .helpers import agreeing, obs, pair

CONFIG = GateConfig(candidate="c", min_accuracy_samples=30)


def test_high_agreement_and_small_gap_pass():
    pairs = [agreeing(i, 20, 20 if i % 5 else 19, gap_per_token=0.01) for i in range(40)]
    got = judge_accuracy(pairs, CONFIG)
    assert got.verdict is Verdict.PASS, got.reasons
    assert got.stats["top1_agreement"]["rate"] == (800 - 8) / 800
    assert got.stats["top1_agreement"]["low"] >= 0.9


def test_a_corrupted_candidate_fails_on_agreement():
    pairs = [agreeing(i, 20, 8, gap_per_token=2.0) for i in range(40)]
    got = judge_accuracy(pairs, CONFIG)
    assert got.verdict is Verdict.FAIL
    assert any("below 90%" in r for r in got.reasons) and any("above 0.1" in r for r in got.reasons)


def test_agreeing_tokens_with_a_large_likelihood_gap_still_fail():
    # Same argmax everywhere but far less sure of it (a flattened distribution).
    got = judge_accuracy([agreeing(i, 20, 20, gap_per_token=0.8) for i in range(40)], CONFIG)
    assert got.verdict is Verdict.FAIL and got.stats["top1_agreement"]["rate"] == 1.0


def test_agreement_near_the_threshold_is_inconclusive():
    got = judge_accuracy([agreeing(i, 10, 8 if i % 2 else 10) for i in range(40)], CONFIG)  # 90% on average
    assert got.verdict is Verdict.INCONCLUSIVE


def test_too_few_scored_pairs_is_inconclusive_and_the_fallback_is_said():
    got = judge_accuracy([agreeing(i, 20, 20) for i in range(29)], CONFIG, teacher_forcing_off="HTTP 400: no echo")
    assert got.verdict is Verdict.INCONCLUSIVE
    assert got.reasons[0] == "fallback: agreement on the generations' shared prefix (HTTP 400: no echo)"


def test_a_declared_lossless_candidate_must_reproduce_every_greedy_output():
    lossless = replace(CONFIG, lossless=True)
    same = [agreeing(i, 20, 20) for i in range(40)]
    assert judge_accuracy(same, lossless).verdict is Verdict.PASS
    one_off = [*same, pair(99, obs(text="a"), obs(text="b"))]
    got = judge_accuracy(one_off, lossless)
    assert got.verdict is Verdict.FAIL and "greedy exact match 40/41" in got.reasons[0]
    assert judge_accuracy(one_off, CONFIG).verdict is Verdict.PASS  # not declared lossless: reported only


def test_pairs_without_evidence_are_not_scored():
    pairs = [agreeing(i, 20, 20) for i in range(30)] + [pair(100 + i) for i in range(10)]
    got = judge_accuracy(pairs, CONFIG)
    assert got.samples == 30 and got.stats["exact_match"]["greedy_pairs"] == 40
