"""Profile: measured on a real engine; JSON round-trips; capacity interpolates."""

import json

import pytest
from click.testing import CliRunner

from tandem.cli import cli
from tandem.contracts import Profile
from tandem.optimize.profile import measure_profile


def test_measured_profile_round_trips_through_json(tiny_llama_dir):
    steps = []
    profile = measure_profile(
        tiny_llama_dir, "int8", batch_sizes=(1, 2), prompt_len=16, new_tokens=6, progress=lambda *a: steps.append(a)
    )
    assert [(done, total) for _, done, total in steps] == [(i, 5) for i in range(5)]  # what the bar shows
    assert steps[-1][0] == "decode at batch 2"
    assert profile.recipe == "int8" and profile.hardware.startswith("cpu-")
    assert set(profile.decode_tokens_per_s) == {1, 2} and all(v > 0 for v in profile.decode_tokens_per_s.values())
    assert profile.prefill_tokens_per_s > 0 and 0 < profile.ttft_s_p50 < profile.cold_start_s + 10
    assert profile.max_slots == 2 and profile.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert Profile.from_json(profile.to_json()) == profile


def test_a_one_thread_replica_is_timed_on_its_cpu_clock_and_a_wider_one_on_the_wall(tiny_llama_dir):
    """One thread: the time it ran (other processes' turns on the core left out); more: wall time."""
    import torch

    before = torch.get_num_threads()
    try:
        clocks = {
            threads: measure_profile(tiny_llama_dir, "baseline", (1,), 8, 2, threads=threads).extra["clock"]
            for threads in (1, 2)
        }
    finally:
        torch.set_num_threads(before)
    assert clocks == {1: "process cpu", 2: "wall"}


def test_profile_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown Profile field"):
        Profile.from_json(json.dumps({"recipe": "x", "bogus": 1}))


def test_decode_capacity_interpolates():
    p = Profile("r", "cpu", "m", 1, 1, 8, {1: 10.0, 4: 40.0, 8: 60.0}, 100.0, 0.1, 1.0)
    assert p.decode_capacity(1) == 10.0 and p.decode_capacity(2) == 20.0 and p.decode_capacity(6) == 50.0
    assert p.decode_capacity(16) == 60.0


def test_profile_command_writes_json(tiny_llama_dir, tmp_path):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(
        cli, ["profile", "--model", str(tiny_llama_dir), "--recipe", "bf16", "--batch-sizes", "1", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert Profile.from_json(out.read_text()).recipe == "bf16"


def test_profile_command_bad_recipe_is_a_clear_error(tiny_llama_dir):
    result = CliRunner().invoke(cli, ["profile", "--model", str(tiny_llama_dir), "--recipe", "int9"])
    assert result.exit_code == 2 and "unknown optimizer 'int9'" in result.output
