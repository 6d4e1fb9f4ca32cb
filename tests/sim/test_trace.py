"""Traces: the bundled CSV, any CSV of its columns, synthetic bursts, rate and length scaling."""

import statistics

import pytest

from tandem.sim.trace import (
    TraceRequest,
    bursty_trace,
    compress,
    default_trace_path,
    fit_context,
    load_trace,
    trace_path,
)


def write_csv(path, rows, header="TIMESTAMP,ContextTokens,GeneratedTokens"):
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def test_the_bundled_trace_is_an_hour_of_requests():
    trace = load_trace()
    assert len(trace) == 19366 and 3400 < trace[-1].arrival_s < 3600
    assert trace_path("conv") == default_trace_path()


def test_any_csv_of_the_columns_loads_in_time_order(tmp_path):
    path = write_csv(tmp_path / "t.csv", [("2024-01-01 00:00:05.5", 100, 10), ("2024-01-01 00:00:01", 50, 0)])
    assert load_trace(path) == [TraceRequest(0.0, 50, 1), TraceRequest(4.5, 100, 10)]  # an answer has a token
    seconds = write_csv(tmp_path / "s.csv", [(10.0, 5, 5), (12.5, 6, 6)])
    assert [r.arrival_s for r in load_trace(seconds)] == [0.0, 2.5]


@pytest.mark.parametrize(
    "header, rows, message",
    [
        ("TIMESTAMP,Prompt,GeneratedTokens", [(1, 2, 3)], "missing column"),
        (None, [("yesterday", 2, 3)], ":2: bad row"),
        (None, [(1, -2, 3)], "token counts"),
        (None, [], "no requests"),
    ],
)
def test_a_bad_csv_is_a_clear_error(tmp_path, header, rows, message):
    path = write_csv(tmp_path / "bad.csv", rows, header or "TIMESTAMP,ContextTokens,GeneratedTokens")
    with pytest.raises(ValueError, match=message):
        load_trace(path)


def test_a_missing_trace_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no such trace file"):
        trace_path(str(tmp_path / "none.csv"))


def test_bursts_are_an_order_of_magnitude_over_the_mean_and_the_mean_holds():
    lengths = [(1000, 100), (200, 20)]
    trace = bursty_trace(5.0, 3600, lengths, burst_factor=10, burst_s=10, bursts_per_hour=12, seed=1)
    assert len(trace) / 3600 == pytest.approx(5.0, rel=0.05)
    per_10s = [0] * 360
    for r in trace:
        per_10s[int(r.arrival_s // 10)] += 1
    busiest = sorted(per_10s)[-12:]
    assert statistics.mean(busiest) / 10 > 8 * 5.0  # twelve 10 s windows near 10x the mean rate
    assert statistics.median(per_10s) / 10 < 5.0  # the rest runs below the mean
    assert {(r.prompt_tokens, r.output_tokens) for r in trace} == set(lengths)


def test_rate_scale_compresses_time_and_context_fitting_scales_lengths():
    trace = [TraceRequest(10.0, 4000, 500), TraceRequest(20.0, 100, 10)]
    assert [r.arrival_s for r in compress(trace, 2.0)] == [5.0, 10.0]
    fitted, factor = fit_context(trace, 512)
    assert factor == pytest.approx(511 / 4500)
    assert all(r.prompt_tokens + r.output_tokens < 512 for r in fitted)
    assert fit_context(trace, 8192) == (trace, 1.0)
    with pytest.raises(ValueError, match="rate scale"):
        compress(trace, 0)
