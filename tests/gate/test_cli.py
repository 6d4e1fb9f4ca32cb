"""`tandem gate` end to end: real replica processes of the bundled model, the real workload. Candidates
that must fail (broken third-party optimizers) are test_cli_failing_candidates.py's: a file of their own,
so the two halves run on both test workers.

Accuracy is judged teacher-forced (`echo`, `logprobs`, `max_tokens: 0` on the replicas); the
fallback for servers that refuse echo is pinned in tests/gate/test_scoring.py.
"""

from __future__ import annotations

import json

import pytest

from tandem.kernels import quant_kernel_isa

from .cli_runs import gate, verdicts
from .helpers import LOOSE_LATENCY

pytestmark = pytest.mark.slow


def test_a_good_candidate_passes_all_three(tmp_path, loose_latency):
    """int8+ngram against baseline, Profiles measured by `tandem profile` subprocesses and cached."""
    settings = loose_latency
    if quant_kernel_isa() != "avx512-vnni":
        # No VNNI on this CPU (an AVX2-only host): int8 runs with 7-bit weights on the AVX2 kernel,
        # and the cost verdict prices the throughput at the SLO batch (the largest within the TPOT
        # SLO: 32 for this small model), where int8 gains least over baseline on such a CPU (and
        # int8+ngram's drafting costs a little). The Profiles are of one-thread replicas, timed on
        # their CPU clock, so the other test worker's load does not move them (by wall time one CI
        # run measured baseline and int8+ngram 2.2x apart). There the test holds only that int8 is
        # not twice as dear; the 0% bar is held on VNNI hosts (the cost verdict itself:
        # test_a_dearer_...).
        settings = tmp_path / "gate.yaml"
        settings.write_text(json.dumps({"gate": {"tolerances": {**LOOSE_LATENCY, "cost": 1.0}}}))
    report = tmp_path / "gate.html"
    proc, result = gate(
        tmp_path, "--incumbent", "baseline", "--candidate", "int8+ngram", "--requests", "20", "--min-samples", "16",
        "--report", str(report), "--settings", str(settings),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert verdicts(result) == {"latency": "PASS", "accuracy": "PASS", "cost": "PASS", "errors": "PASS"}
    assert result["state"] == "passed" and len(result["pairs"]) == 20
    assert result["incumbent"]["profile"]["recipe"] == "baseline"
    assert result["candidate"]["profile"]["recipe"] == "int8+ngram"
    assert len(list((tmp_path / "cache" / "profiles").glob("*.json"))) == 2  # cached for the next run
    html = report.read_text()
    assert "data:image/png;base64," in html and '<span class="PASS">PASS</span>' in html
    methods = result["verdict"]["metrics"]["accuracy"]["stats"]["methods"]
    assert result["teacher_forcing_off"] is None and set(methods) == {"teacher-forced"}


def test_a_lossless_candidate_reproduces_every_greedy_output_and_too_few_samples_are_inconclusive(tmp_path, profiles):
    """ngram is declared lossless: every greedy pair must be identical, token for token. The same run
    holds too few pairs for latency (12 of the 50 the settings ask for): that metric, and so the gate,
    is INCONCLUSIVE (exit 2), while the cost verdict (a cheaper candidate, same Profiles) still PASSES."""
    settings = tmp_path / "gate.yaml"
    block = {"tolerances": LOOSE_LATENCY, "min_samples": {"latency": 50, "accuracy": 10, "errors": 10}}
    settings.write_text(json.dumps({"gate": block}))
    proc, result = gate(
        tmp_path, "--incumbent", "baseline", "--candidate", "ngram", "--lossless", "--requests", "12",
        "--incumbent-profile", str(profiles["same"]), "--candidate-profile", str(profiles["same"]),
        "--candidate-price", "0.05", "--settings", str(settings),
    )  # fmt: skip
    accuracy = result["verdict"]["metrics"]["accuracy"]
    assert accuracy["verdict"] == "PASS" and accuracy["stats"]["exact_match"] == {
        "greedy_pairs": 12, "identical": 12, "rate": 1.0,
    }  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert result["verdict"]["verdict"] == "INCONCLUSIVE" and result["state"] == "inconclusive"
    assert verdicts(result) == {"latency": "INCONCLUSIVE", "accuracy": "PASS", "cost": "PASS", "errors": "PASS"}


def test_bad_input_exits_3_with_one_line(tmp_path, profiles):
    settings = tmp_path / "gate.yaml"
    settings.write_text("gate:\n  tolerances: {latency_median: -1}\n")
    proc, _ = gate(tmp_path, "--incumbent", "baseline", "--candidate", "int8", "--settings", str(settings))
    assert (
        proc.returncode == 3 and "tolerances.latency_median: Input should be greater than or equal to 0" in proc.stderr
    )
    proc, _ = gate(tmp_path, "--incumbent", "baseline")
    assert proc.returncode == 3 and "Missing option '--candidate'" in proc.stderr
    bad_trace = tmp_path / "trace.csv"
    bad_trace.write_text("ContextTokens,Generated\n10,5\n")
    proc, _ = gate(tmp_path, "--incumbent", "baseline", "--candidate", "int8", "--trace", str(bad_trace))
    assert proc.returncode == 3 and "missing column(s) GeneratedTokens" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_replica_that_will_not_start_exits_3(tmp_path, profiles):
    proc, _ = gate(
        tmp_path, "--incumbent", "baseline", "--candidate", "no-such-optimizer", "--requests", "2",
        "--incumbent-profile", str(profiles["same"]), "--candidate-profile", str(profiles["same"]),
    )  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "the no-such-optimizer replica exited" in proc.stderr and "no-such-optimizer" in proc.stderr
    assert "Traceback" not in proc.stderr
