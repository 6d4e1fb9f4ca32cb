"""Profiles from the splitwise GPU timings (MIT, Copyright (c) 2024 Pratyush Patel) reproduce the CSV's rows."""

import csv
import json
import statistics

import pytest
from click.testing import CliRunner

from tandem.cli import cli
from tandem.contracts import Profile
from tandem.data import SPLITWISE_TIMINGS, data_path
from tandem.data.splitwise import splitwise_profile, splitwise_targets

ROWS = list(csv.DictReader(data_path(SPLITWISE_TIMINGS).open()))


def rows(model, hardware, tp, **match):
    return [r for r in ROWS if r["model"] == model and r["hardware"] == hardware and r["tensor_parallel"] == str(tp)
            and all(r[k] == str(v) for k, v in match.items())]  # fmt: skip


def test_every_model_and_hardware_is_listed_with_its_parallel_degrees():
    targets = splitwise_targets()
    assert targets["llama2-70b/h100-80gb"] == [2, 4, 8] and targets["bloom-176b/a100-80gb"] == [8]
    assert set(targets) == {f"{r['model']}/{r['hardware']}" for r in ROWS}


@pytest.mark.parametrize("hardware", ["a100-80gb", "h100-80gb"])
def test_decode_and_prefill_rates_reproduce_the_csv(hardware):
    profile = splitwise_profile(f"llama2-70b/{hardware}", tensor_parallel=2)
    for batch in (1, 8, 64):
        ms = statistics.fmean(float(r["token_time"]) for r in rows("llama2-70b", hardware, 2, prompt_size=512,
                                                                       batch_size=batch, token_size=128))  # fmt: skip
        assert profile.decode_tokens_per_s[batch] == pytest.approx(batch * 1000 / ms)
    prompt_ms = statistics.fmean(float(r["prompt_time"]) for r in rows("llama2-70b", hardware, 2, prompt_size=1024,
                                                                         batch_size=1, token_size=128))  # fmt: skip
    assert profile.prefill_tokens_per_s == pytest.approx(1024 * 1000 / prompt_ms)
    assert profile.ttft_s_p50 == pytest.approx(prompt_ms / 1000)
    assert profile.extra["prompt_time_ms_by_size"]["1024"] == pytest.approx(prompt_ms, abs=1e-3)


def test_the_replica_spans_its_tensor_parallel_degree_and_what_fits_in_its_memory():
    profile = splitwise_profile("llama2-70b/a100-80gb")  # degree 2 decodes the most per accelerator
    assert profile.accelerators == 2 and profile.extra["tensor_parallel"] == 2 and profile.max_slots == 64
    assert profile.weight_bytes == 68_976_648_192 * 2 and profile.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    free = int(2 * 80 * 2**30 * 0.9) - profile.weight_bytes
    assert profile.kv_cache_tokens == free // profile.kv_bytes_per_token
    assert profile.source == "imported" and "assumed" in profile.source_note and profile.cold_start_s == 60.0
    assert "MIT" in profile.extra["attribution"]
    assert Profile.from_json(profile.to_json()) == profile


def test_a_projection_says_so_and_states_its_factor():
    base = splitwise_profile("llama2-70b/h100-80gb", tensor_parallel=4)
    projected = splitwise_profile("llama2-70b/h100-80gb", tensor_parallel=4, speedup=1.5, weight_bits=8)
    assert projected.source == "projected" and "x1.5" in projected.source_note and "8 bits" in projected.source_note
    assert projected.decode_tokens_per_s[8] == pytest.approx(1.5 * base.decode_tokens_per_s[8])
    assert projected.weight_bytes == base.weight_bytes // 2 and projected.kv_cache_tokens > base.kv_cache_tokens


@pytest.mark.parametrize(
    "target, kwargs, message",
    [
        ("llama2-70b/tpu", {}, "no splitwise timings"),
        ("llama2-70b/a100-80gb", {"tensor_parallel": 3}, "not measured"),
        ("bloom-176b/a100-80gb", {"tensor_parallel": 8, "memory_utilization": 0.5}, "no room"),
    ],
)
def test_bad_targets_are_clear_errors(target, kwargs, message):
    with pytest.raises(ValueError, match=message):
        splitwise_profile(target, **kwargs)


def test_the_profile_command_imports_without_measuring(tmp_path):
    out = tmp_path / "h100.json"
    args = ["profile", "--from-splitwise", "llama2-70b/h100-80gb", "--cold-start-s", "90", "-o", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    profile = Profile.from_json(out.read_text())
    assert profile.hardware == "h100-80gb" and profile.cold_start_s == 90 and profile.source == "imported"
    bad = CliRunner().invoke(cli, ["profile", "--from-splitwise", "gpt-5/h100-80gb"])
    assert bad.exit_code == 1 and "no splitwise timings" in bad.output and "Traceback" not in bad.output
    projected = CliRunner().invoke(cli, [*args[:3], "--speedup", "1.66", "--recipe", "int8+kv-bf16+ngram"])
    assert json.loads(projected.output)["source"] == "projected"
    assert json.loads(projected.output)["recipe"] == "int8+kv-bf16+ngram"
