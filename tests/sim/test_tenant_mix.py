"""`tandem sim --tenant-mix`: requests drawn into priority classes, higher classes admitted first at
the simulated gateway, SLO attainment reported per class."""

import json

import pytest
from click.testing import CliRunner

from tandem.cli import cli
from tandem.contracts import Profile
from tandem.sim.tenant_mix import assign_classes, parse_tenant_mix
from tandem.sim.trace import poisson_trace


def test_a_mix_is_parsed_and_drawn_with_its_shares():
    classes = parse_tenant_mix("interactive:0.25,batch:0.5,vip:0.25:9")
    assert [(c.name, c.priority) for c in classes] == [("interactive", 1), ("batch", 0), ("vip", 9)]
    trace = assign_classes(poisson_trace(20.0, 200.0, 100, 10, seed=1), classes, seed=1)
    share = sum(1 for r in trace if r.tenant_class == "batch") / len(trace)
    assert 0.45 < share < 0.55 and {r.priority for r in trace if r.tenant_class == "vip"} == {9}


@pytest.mark.parametrize(
    ("text", "named"), [("interactive:0.5", "sum to 0.5"), ("gold:1", "PRIORITY"), ("a:x", "number"), ("", "empty")]
)
def test_a_bad_mix_is_named(text, named):
    with pytest.raises(ValueError, match=named):
        parse_tenant_mix(text)


def test_attainment_per_class_favours_the_higher_priority_when_the_fleet_is_short(tmp_path):
    profile = Profile(
        recipe="small", hardware="cpu-test", model="m", weight_bytes=10**8, kv_bytes_per_token=10**4, max_slots=4,
        decode_tokens_per_s={1: 40.0, 4: 120.0}, prefill_tokens_per_s=4000.0, ttft_s_p50=0.02, cold_start_s=5.0,
        max_model_len=512,
    )  # fmt: skip
    (tmp_path / "p.json").write_text(profile.to_json())
    csv = tmp_path / "t.csv"  # 6 requests a second for 2 minutes: twice what its one replica serves
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t / 6:.3f},200,40\n" for t in range(720)))
    result = CliRunner().invoke(cli, [
        "sim", "--trace", str(csv), "--variant", f"v={tmp_path / 'p.json'}", "--warmup-s", "0",
        "--policies", "hpa", "--max-replicas", "1", "--admission-cap", "--slo-ttft-s", "2",
        "--slo-tpot-s", "0.5", "--tenant-mix", "interactive:0.3,batch:0.7", "--json", str(tmp_path / "out.json"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "SLO met per class, v / hpa: batch" in result.output
    row = json.loads((tmp_path / "out.json").read_text())["results"][0]
    by_class = row["slo_attainment_by_class"]
    assert set(by_class) == {"interactive", "batch"}
    assert by_class["interactive"] > by_class["batch"] + 0.2, by_class
