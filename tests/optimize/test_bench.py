"""tandem bench: every recipe and the transformers rows on one workload; JSON in the documented shape."""

import json

from click.testing import CliRunner

from tandem.cli import cli
from tandem.model import load_model
from tandem.optimize.bench import _fastest_run, summarize, usd_per_million_tokens
from tandem.workload import load_workload


def test_cost_per_million_tokens():
    assert usd_per_million_tokens(3.6, 1000.0) == 1.0


def test_summarize_percentiles():
    timings = [(0.0, 1.0, 3.0, 3), (0.0, 2.0, 2.5, 2)]
    row = summarize("r", timings, usd_per_hour=3.6)
    assert row.output_tokens_per_s == 5 / 3.0 and row.ttft_p50_s == 1.5
    assert row.tpot_p50_s == 0.75 and row.output_tokens == 5


def test_the_fastest_run_by_wall_time_is_reported():
    slow, mid, fast = ([(0.0, 0.1, wall, 4)] for wall in (3.0, 2.0, 1.0))
    assert _fastest_run([slow, fast, mid]) is fast
    assert _fastest_run([slow]) is slow


def test_workload_is_reproducible_and_fits_the_context(tiny_llama_dir):
    tokenizer = load_model(tiny_llama_dir).tokenizer
    a = load_workload(tokenizer, 256, 20, seed=3)
    assert a == load_workload(tokenizer, 256, 20, seed=3)
    assert all(len(r.prompt_ids) + r.max_tokens < 256 and r.max_tokens >= 8 for r in a)
    assert a != load_workload(tokenizer, 256, 20, seed=4)


def test_bench_command_json_shape(tiny_llama_dir, tiny_draft_dir, tmp_path):
    out = tmp_path / "bench.json"
    recipes = f"int8,ngram,speculative(draft={tiny_draft_dir})"
    result = CliRunner().invoke(
        cli,
        ["bench", "--model", str(tiny_llama_dir), "--recipes", recipes, "--requests", "6", "--repeats", "2"]
        + ["--json", str(out)],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    names = [r["recipe"] for r in payload["results"]]
    assert names[0] == "baseline" and "hf-sequential" in names and "hf-static-batch" in names
    for row in payload["results"]:
        for key in (
            "output_tokens_per_s",
            "ttft_p50_s",
            "ttft_p99_s",
            "tpot_p50_s",
            "tpot_p99_s",
            "usd_per_million_tokens",
        ):
            assert row[key] >= 0, (row["recipe"], key)
        assert row["output_tokens"] == payload["results"][0]["output_tokens"]  # the same workload
    assert payload["price_source"] and payload["usd_per_hour"] > 0 and payload["repeats"] == 2


def test_bench_unknown_recipe_is_a_clear_error(tiny_llama_dir):
    result = CliRunner().invoke(cli, ["bench", "--model", str(tiny_llama_dir), "--recipes", "fast", "--no-hf"])
    assert result.exit_code == 2 and "unknown optimizer 'fast'" in result.output


def test_a_row_that_fails_in_its_worker_is_a_clear_error(tiny_llama_dir, tmp_path):
    recipe = f"speculative(draft={tmp_path / 'no-such-draft'})"
    result = CliRunner().invoke(
        cli, ["bench", "--model", str(tiny_llama_dir), "--recipes", recipe, "--no-hf", "--requests", "2"]
    )
    assert result.exit_code == 1
    assert "bench row 'speculative(draft=" in result.output and "no-such-draft" in result.output
