"""`tandem sim`: the bundled trace and any CSV of its columns, every output, clear errors, no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tandem.cli import cli
from tandem.contracts import Profile
from tandem.data.splitwise import splitwise_profile

FIELDS = {"variant", "policy", "replica_hours", "replica_hours_per_day", "peak_replicas", "mean_replicas",
          "slo_attainment", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "cost_usd",
          "usd_per_million_output_tokens", "scale_events", "lost", "unserved"}  # fmt: skip


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    h100 = root / "h100.json"
    h100.write_text(splitwise_profile("llama2-70b/h100-80gb").to_json())
    small = Profile(
        recipe="small", hardware="cpu-test", model="m", weight_bytes=10**8, kv_bytes_per_token=10**4, max_slots=16,
        decode_tokens_per_s={1: 100.0, 16: 800.0}, prefill_tokens_per_s=5000.0, ttft_s_p50=0.02, cold_start_s=5.0,
        max_model_len=512,
    )  # fmt: skip
    cpu = root / "cpu.json"
    cpu.write_text(small.to_json())
    return {"h100": h100, "cpu": cpu}


def sim(*args: str):
    return CliRunner().invoke(cli, ["sim", *args])


def test_the_bundled_trace_with_every_output(profiles, tmp_path):
    out = tmp_path / "out"
    result = sim("--trace", "conv", "--duration-s", "300", "--variant", f"h100={profiles['h100']}@24.6",
                 "--policies", "static-peak,capacity", "--slo-ttft-s", "2.5", "--slo-tpot-s", "0.15",
                 "--node-memory-gb", "640", "--node-accelerators", "8",
                 "--json", f"{out}.json", "--plot", f"{out}.png", "--report", f"{out}.html")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "capacity" in result.output and "Splitwise" in result.output and "CC-BY 4.0" in result.output
    payload = json.loads((tmp_path / "out.json").read_text())
    assert [(r["variant"], r["policy"]) for r in payload["results"]] == [("h100", "static-peak"), ("h100", "capacity")]
    for row in payload["results"]:
        assert FIELDS <= set(row) and row["lost"] == 0 and row["unserved"] == 0
        assert row["profile_source"] == "imported" and row["node_hours_per_day"] > 0
        assert row["accelerator_hours_per_day"] == pytest.approx(2 * row["replica_hours_per_day"])
    assert payload["trace"]["name"] == "conv" and len(payload["attribution"]) == 2
    assert (tmp_path / "out.png").read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "out.html").read_text()
    assert "data:image/png;base64," in page and "static-peak" in page and "Pratyush Patel" in page


def test_any_csv_of_the_trace_columns(profiles, tmp_path):
    csv = tmp_path / "burst.csv"
    rows = [f"{t / 4:.2f},{300},{40}" for t in range(0, 4 * 240)]  # 4 requests/s for 4 minutes ...
    rows += [f"{60 + t / 40:.3f},{300},{40}" for t in range(400)]  # ... and 40/s for 10 s at one minute
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "o.json"
    result = sim("--trace", str(csv), "--variant", f"a={profiles['cpu']}", "--variant", f"b={profiles['cpu']}@0.1",
                 "--slo-ttft-s", "1", "--slo-tpot-s", "0.05", "--warmup-s", "30", "--json", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert len(payload["results"]) == 8 and payload["trace"]["requests"] == 1360
    for row in payload["results"]:
        assert row["lost"] == 0 and row["unserved"] == 0 and row["served"] == 1360
        assert (row["cost_usd"] is None) == (row["variant"] == "a")  # no price given: no cost
    assert payload["simulated_s_per_wall_s"] > 0


def test_rate_scale_and_context_fitting(profiles, tmp_path):
    out = tmp_path / "o.json"
    result = sim("--duration-s", "120", "--rate-scale", "2", "--fit-context", "--variant", f"c={profiles['cpu']}",
                 "--policies", "capacity", "--json", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    trace = json.loads(out.read_text())["trace"]
    assert trace["duration_s"] == 60 and trace["rate_scale"] == 2 and trace["length_scale"] < 0.2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variant", "x"], "expected NAME=PROFILE.json"),
        (["--variant", "x=/no/such.json"], "cannot read the Profile"),
        (["--variant", "x={cpu}@cheap"], "price after '@'"),
        (["--variant", "x={cpu}", "--policies", "vpa"], "unknown vpa"),
        (["--variant", "x={cpu}", "--variant", "x={cpu}"], "names must differ"),
        (["--variant", "x={cpu}", "--trace", "/no/trace.csv"], "no such trace file"),
    ],
)
def test_bad_input_is_a_one_line_error(profiles, args, message):
    result = sim(*(a.format(cpu=profiles["cpu"]) for a in args))
    assert result.exit_code in (1, 2) and message in result.output and "Traceback" not in result.output


def test_a_file_that_is_not_a_profile(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"recipe": "x"}')
    result = sim("--variant", f"x={bad}")
    assert result.exit_code == 2 and "not a Profile JSON" in result.output


def test_the_command_line_never_imports_torch():
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom tandem.cli import cli\n"
        "for args in (['--help'], ['sim', '--help']):\n"
        "    assert CliRunner().invoke(cli, args).exit_code == 0\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
