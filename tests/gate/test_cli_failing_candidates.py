"""`tandem gate` end to end on candidates that must fail, each on one of the three metrics it judges
from traffic or on cost: third-party optimizers installed as their own distribution
(tests/plugins/tandem-gate-test-optimizers) and found through the `tandem.optimizers` entry point.
(The passing and inconclusive runs, and the gate's bad input, are test_cli.py's.)
"""

from __future__ import annotations

import pytest

from .cli_runs import gate, verdicts

pytestmark = pytest.mark.slow


def judged(tmp_path, plugins, profiles, candidate: str):
    """12 requests through baseline and `candidate`, 10 pairs enough, the same Profile on both sides."""
    same = str(profiles["same"])
    return gate(
        tmp_path, "--incumbent", "baseline", "--candidate", candidate, "--requests", "12", "--min-samples", "10",
        "--incumbent-profile", same, "--candidate-profile", same, plugins=plugins,
    )  # fmt: skip


def test_a_corrupt_candidate_fails_accuracy(tmp_path, plugins, profiles):
    proc, result = judged(tmp_path, plugins, profiles, "corrupt-weights")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert verdicts(result)["accuracy"] == "FAIL" and verdicts(result)["errors"] == "PASS"
    assert result["verdict"]["metrics"]["accuracy"]["stats"]["top1_agreement"]["high"] < 0.9
    assert set(result["verdict"]["metrics"]["accuracy"]["stats"]["methods"]) == {"teacher-forced"}


def test_a_slow_candidate_fails_latency(tmp_path, plugins, profiles):
    proc, result = judged(tmp_path, plugins, profiles, "slow-steps(delay_ms=80)")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert verdicts(result)["latency"] == "FAIL"
    assert verdicts(result)["accuracy"] != "FAIL"  # right, only slow
    assert result["verdict"]["metrics"]["latency"]["stats"]["tpot"]["median"]["ratio"] > 1.3


def test_a_candidate_failing_every_request_fails_and_a_dearer_one_fails_cost(tmp_path, plugins, profiles):
    """Every candidate request fails (errors FAIL); its Profile is also the slower one at the same
    price, so it is dearer per token (cost FAIL: the cost verdict reads only Profiles and prices)."""
    proc, result = gate(
        tmp_path, "--incumbent", "baseline", "--candidate", "failing-steps", "--requests", "4",
        "--incumbent-profile", str(profiles["same"]), "--candidate-profile", str(profiles["slower"]), plugins=plugins,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = result["verdict"]["metrics"]["errors"]
    assert errors["verdict"] == "FAIL" and errors["stats"]["candidate_errors"] == 4
    assert all(p["incumbent"]["error"] is None for p in result["pairs"])  # the clients' side never failed
    assert verdicts(result)["cost"] == "FAIL" and result["state"] == "failed"
    assert "dearer than the incumbent" in " ".join(result["verdict"]["metrics"]["cost"]["reasons"])
