"""The error verdict: candidate failures on requests the incumbent served."""

from tandem.gate.config import GateConfig
from tandem.gate.errors import judge_errors
from tandem.gate.verdict import Verdict

from .helpers import obs, pair

CONFIG = GateConfig(candidate="c", min_error_samples=20, max_error_rate=0.02)
FAILED = obs(error="HTTP 500: boom", status=500)


def test_within_and_over_budget():
    clean = [pair(i) for i in range(100)]
    assert judge_errors(clean, CONFIG).verdict is Verdict.PASS
    two = [*clean[:98], pair(98, cand=FAILED), pair(99, cand=FAILED)]
    assert judge_errors(two, CONFIG).verdict is Verdict.PASS  # 2% is the budget
    three = [*two, pair(100, cand=FAILED)]
    got = judge_errors(three, CONFIG)
    assert got.verdict is Verdict.FAIL and got.stats["kinds"] == {"HTTP 500": 3}


def test_a_candidate_failing_everything_fails_before_the_minimum():
    got = judge_errors([pair(0, cand=FAILED)], CONFIG)
    assert got.verdict is Verdict.FAIL and "over budget already" in got.reasons[0]


def test_few_clean_pairs_are_inconclusive():
    assert judge_errors([pair(i) for i in range(19)], CONFIG).verdict is Verdict.INCONCLUSIVE


def test_requests_both_failed_are_not_the_candidates_fault():
    pairs = [pair(i) for i in range(20)] + [pair(20 + i, inc=FAILED, cand=FAILED) for i in range(10)]
    got = judge_errors(pairs, CONFIG)
    assert got.verdict is Verdict.PASS and got.stats["both_failed"] == 10 and got.stats["pairs"] == 20
