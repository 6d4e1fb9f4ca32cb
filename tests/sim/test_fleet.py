"""A fleet of models in the simulator: packing every model's replicas over time, the scenarios, the CLI."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from tandem.cli import cli
from tandem.contracts import Profile
from tandem.schedule.packing import NodeShape
from tandem.sim.experiment import SimVariant, Slo
from tandem.sim.fleet import FleetModel, pack_over_time, run_fleet
from tandem.sim.fleet_cli import fleet_traces
from tandem.sim.simulator import SimConfig
from tandem.sim.trace import poisson_trace

MiB = 1 << 20


def profile(recipe: str, weight_mib: int, speed: float = 1.0) -> Profile:
    return Profile(
        recipe=recipe, hardware="cpu-test", model="m", weight_bytes=weight_mib * MiB, kv_bytes_per_token=1024,
        max_slots=8, decode_tokens_per_s={1: 100.0 * speed, 8: 400.0 * speed}, prefill_tokens_per_s=5000.0,
        ttft_s_p50=0.02, cold_start_s=5.0, max_model_len=512,
    )  # fmt: skip


def test_packing_over_time_integrates_the_nodes_every_moment_needs():
    # a: 2 replicas of 300 MiB all along; b: 1 of 500 MiB from 50 s, 3 from 80 s. Nodes of 1 GiB.
    held = {"a": [(-10.0, 2)], "b": [(0.0, 0), (50.0, 1), (80.0, 3)]}
    use = pack_over_time(held, {"a": 300 * MiB, "b": 500 * MiB}, NodeShape(1024 * MiB), 100.0)
    # [0, 50): 600 MiB, 1 node; [50, 80): 1100 MiB: FFD 500+300 | 300, 2 nodes; [80, 100): 500x3 + 300x2: 3 nodes.
    assert use.node_seconds == pytest.approx(50 * 1 + 30 * 2 + 20 * 3)
    assert use.peak_nodes == 3 and use.peak_memory_bytes == 2100 * MiB
    assert use.memory_byte_seconds == pytest.approx((600 * 50 + 1100 * 30 + 2100 * 20) * MiB)


def test_fleet_traces_are_model_equals_trace_or_one_plain_trace():
    assert fleet_traces(["conv"]) is None
    assert fleet_traces(["/data/a=b.csv"]) is None  # a path, not a model
    assert fleet_traces(["code=conv", "chat=bursty"]) == [("code", "conv"), ("chat", "bursty")]
    with pytest.raises(click.BadParameter, match="every trace as MODEL=TRACE"):
        fleet_traces(["code=conv", "bursty"])
    with pytest.raises(click.BadParameter, match="one trace per model"):
        fleet_traces(["code=conv", "code=bursty"])


CONFIG = SimConfig(warmup_s=0.0, tail_s=60.0)


def test_a_smaller_variant_of_one_model_needs_fewer_nodes_for_the_same_traffic():
    trace = tuple(poisson_trace(2.0, 240.0, 64, 32, seed=1))
    code = FleetModel(
        "code", trace, (SimVariant("base", profile("baseline", 600)), SimVariant("int8", profile("int8", 300)))
    )
    chat = FleetModel(
        "chat", tuple(poisson_trace(2.0, 240.0, 64, 32, seed=2)), (SimVariant("base", profile("baseline", 600)),)
    )
    scenarios = run_fleet(
        [code, chat], ["static-peak"], Slo(), duration_s=240.0, config=CONFIG, node=NodeShape(1024 * MiB)
    )
    rows = {row["variants"]["code"]: row for row in (s.row() for s in scenarios)}
    assert set(rows) == {"base", "int8"} and all(r["variants"]["chat"] == "base" for r in rows.values())
    base, int8 = rows["base"], rows["int8"]
    # The same speeds: the same replicas; int8's replicas are smaller, so the fleet packs onto fewer nodes.
    assert int8["replica_hours_per_day"] == pytest.approx(base["replica_hours_per_day"])
    assert int8["node_hours_per_day"] < base["node_hours_per_day"]
    assert int8["mean_memory_gib"] < base["mean_memory_gib"]
    assert [m["model"] for m in base["models"]] == ["code", "chat"] and base["lost"] == 0


def test_the_cli_runs_a_fleet_and_records_the_comparison(tmp_path):
    paths = {}
    for name, prof in (("base", profile("baseline", 600)), ("int8", profile("int8", 300, speed=2.0))):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(prof.to_json())
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:{m:02d}:{s:02d}.000,64,32\n" for m in range(3) for s in range(0, 60, 2)
    ))  # fmt: skip
    out = tmp_path / "fleet.json"
    result = CliRunner().invoke(cli, [
        "sim", "--trace", f"code={trace}", "--trace", f"chat={trace}", "--variant", f"code:base={paths['base']}",
        "--variant", f"code:int8={paths['int8']}", "--variant", f"chat:base={paths['base']}", "--policies", "hpa",
        "--node-memory-gb", "1", "--warmup-s", "0", "--json", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "code on int8 instead of base: one replica frees 300 MiB" in result.output
    payload = json.loads(out.read_text())
    assert payload["traces"]["code"]["requests"] == 90 and len(payload["scenarios"]) == 2
    assert {"node_hours_per_day", "peak_nodes", "mean_memory_gib"} <= set(payload["scenarios"][0])


def test_a_fleet_variant_must_name_its_model():
    result = CliRunner().invoke(cli, ["sim", "--trace", "code=conv", "--variant", "base=x.json"])
    assert result.exit_code == 2 and "MODEL:NAME=PROFILE.json" in result.output
    result = CliRunner().invoke(cli, ["sim", "--trace", "conv", "--trace", "bursty", "--variant", "base=x.json"])
    assert result.exit_code == 2 and "one trace, or MODEL=TRACE" in result.output
