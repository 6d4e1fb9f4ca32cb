"""tandem bench: every recipe and the transformers rows on one workload; JSON in the documented shape."""

import io
import json
import sys

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from tandem.cli import cli
from tandem.model import load_model
from tandem.optimize import bench_workers
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


def test_bench_command_json_shape(tiny_llama_dir, tiny_draft_dir, tmp_path, monkeypatch):
    """Every recipe and the transformers rows on a given trace, two rounds; the JSON in the documented
    shape and the plot. (The bundled trace, the default, is the wheel test's: tests/test_wheel.py.)"""
    monkeypatch.setattr(bench_workers, "SETTLE_S", 0.0)  # a pause for the timings' sake; none are judged here
    trace = tmp_path / "lengths.csv"
    trace.write_text("ContextTokens,GeneratedTokens\n40,9\n80,9\n")
    out, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    recipes = f"int8,ngram,speculative(draft={tiny_draft_dir})"
    result = CliRunner().invoke(
        cli,
        ["bench", "--model", str(tiny_llama_dir), "--recipes", recipes, "--requests", "6", "--repeats", "2"]
        + ["--trace", str(trace), "--json", str(out), "--plot", str(plot)],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    names = [r["recipe"] for r in payload["results"]]
    assert names == [
        "baseline",
        "int8",
        "ngram",
        f"speculative(draft={tiny_draft_dir})",
        "hf-sequential",
        "hf-static-batch",
    ]
    assert payload["price_source"] and payload["usd_per_hour"] > 0 and payload["repeats"] == 2
    base = payload["results"][0]
    for row in payload["results"]:
        where = row["recipe"]
        # Each row really ran the six requests and timed them: no zero rates. Every request is from the
        # two-row trace: 9 output tokens scaled to the tiny model's context, at least 8.
        assert row["requests"] == 6 and row["output_tokens"] == base["output_tokens"] >= 6 * 8, where
        assert row["wall_s"] > 0 and row["output_tokens_per_s"] == pytest.approx(row["output_tokens"] / row["wall_s"])
        assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"] <= row["wall_s"], where
        assert 0 < row["tpot_p50_s"] <= row["tpot_p99_s"] <= row["wall_s"], where
        cost = usd_per_million_tokens(payload["usd_per_hour"], row["output_tokens_per_s"])
        assert row["usd_per_million_tokens"] == pytest.approx(cost) and cost > 0, where
        assert row["throughput_vs_baseline"] == pytest.approx(row["output_tokens_per_s"] / base["output_tokens_per_s"])
        assert row["cost_vs_baseline"] == pytest.approx(1 / row["throughput_vs_baseline"]), where
    assert base["throughput_vs_baseline"] == 1.0
    assert plot.read_bytes().startswith(b"\x89PNG")


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


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such trace file"), ("prompt,output\n1,2\n", "missing column(s) ContextTokens, GeneratedTokens")],
)
def test_a_missing_or_malformed_trace_is_one_line_and_exit_1(tiny_llama_dir, tmp_path, content, message):
    trace = tmp_path / "trace.csv"
    if content is not None:
        trace.write_text(content)
    result = CliRunner().invoke(cli, ["bench", "--model", str(tiny_llama_dir), "--no-hf", "--trace", str(trace)])
    assert result.exit_code == 1 and message in result.output and str(trace) in result.output
    assert "Traceback" not in result.output


def test_without_matplotlib_plot_is_one_line_before_anything_runs(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    result = CliRunner().invoke(cli, ["bench", "--model", str(tiny_llama_dir), "--plot", str(tmp_path / "b.png")])
    assert result.exit_code == 1 and "--plot needs matplotlib: pip install 'tandem[plots]'" in result.output


def test_without_transformers_its_rows_skip_with_a_note_and_hf_is_refused(monkeypatch):
    from tandem.optimize.cli import _hf_rows

    console = Console(file=io.StringIO())
    monkeypatch.setitem(sys.modules, "transformers", None)  # find_spec now says it is not installed
    assert _hf_rows(None, console) is False and "hf-* rows are skipped" in console.file.getvalue()
    assert _hf_rows(False, console) is False
    with pytest.raises(click.ClickException, match="--hf needs transformers"):
        _hf_rows(True, console)
    monkeypatch.delitem(sys.modules, "transformers")
    assert _hf_rows(None, console) is True  # installed here (a dev dependency)
