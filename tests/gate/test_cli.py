"""`tandem gate` end to end: real replica processes of the bundled model, the real workload.

The broken candidates are third-party optimizers installed as their own distribution
(tests/plugins/tandem-gate-test-optimizers) and found through the `tandem.optimizers` entry point.

Accuracy is judged teacher-forced (`echo`, `logprobs`, `max_tokens: 0` on the replicas); the
fallback for servers that refuse echo is pinned in tests/gate/test_scoring.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.kernels import cache_dir, quant_kernel_isa

from .helpers import LOOSE_LATENCY, profile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict[str, Path]:
    """Profile files for runs that are not about cost: the same capacity on both sides."""
    root = tmp_path_factory.mktemp("profiles")
    out = {}
    for name, rates in (("same", {1: 50.0, 4: 180.0, 16: 500.0, 32: 700.0}), ("slower", {1: 30.0, 32: 300.0})):
        out[name] = root / f"{name}.json"
        out[name].write_text(profile(name, rates).to_json())
    return out


def gate(tmp_path, *args, plugins: Path | None = None, timeout=300) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    env["TANDEM_CACHE"] = str(tmp_path / "cache")  # its own profiles ...
    (tmp_path / "cache").mkdir(exist_ok=True)
    if not (tmp_path / "cache" / "kernels").exists():  # ... and the kernels already built for this machine
        cache_dir().mkdir(parents=True, exist_ok=True)
        (tmp_path / "cache" / "kernels").symlink_to(cache_dir(), target_is_directory=True)
    if plugins is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugins), env.get("PYTHONPATH")]))
    out = tmp_path / "gate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "gate", "--json", str(out), "--log-dir", str(tmp_path / "logs"), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    result = json.loads(out.read_text()) if out.is_file() else {}
    return proc, result


@pytest.fixture(scope="module")
def loose_latency(tmp_path_factory) -> Path:
    """Settings for runs that are not about latency (helpers.LOOSE_LATENCY)."""
    path = tmp_path_factory.mktemp("settings") / "gate.yaml"
    path.write_text(json.dumps({"gate": {"tolerances": LOOSE_LATENCY}}))  # JSON is YAML
    return path


def verdicts(result: dict) -> dict[str, str]:
    return {name: m["verdict"] for name, m in result["verdict"]["metrics"].items()}


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


def test_a_corrupt_candidate_fails_accuracy(tmp_path, plugins, profiles):
    proc, result = gate(
        tmp_path, "--incumbent", "baseline", "--candidate", "corrupt-weights", "--requests", "12",
        "--min-samples", "10", "--incumbent-profile", str(profiles["same"]), "--candidate-profile",
        str(profiles["same"]), plugins=plugins,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert verdicts(result)["accuracy"] == "FAIL" and verdicts(result)["errors"] == "PASS"
    assert result["verdict"]["metrics"]["accuracy"]["stats"]["top1_agreement"]["high"] < 0.9
    assert set(result["verdict"]["metrics"]["accuracy"]["stats"]["methods"]) == {"teacher-forced"}


def test_a_slow_candidate_fails_latency(tmp_path, plugins, profiles):
    proc, result = gate(
        tmp_path, "--incumbent", "baseline", "--candidate", "slow-steps(delay_ms=80)", "--requests", "12",
        "--min-samples", "10", "--incumbent-profile", str(profiles["same"]), "--candidate-profile",
        str(profiles["same"]), plugins=plugins,
    )  # fmt: skip
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
