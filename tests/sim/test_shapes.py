"""Synthetic trace shapes: seeded (the same requests every run) and shaped as their names say."""

from __future__ import annotations

import statistics

from tandem.sim.shapes import code_completion_trace, diurnal_trace, long_context_trace
from tandem.sim.trace import fit_context


def test_code_completion_is_bursty_with_2k_prompts_and_short_answers():
    trace = code_completion_trace(1800.0, 4.0, 10.0, 10.0, 12, seed=0)
    assert trace == code_completion_trace(1800.0, 4.0, 10.0, 10.0, 12, seed=0)  # regenerated exactly
    assert 1500 < statistics.median(r.prompt_tokens for r in trace) < 2500
    assert 20 < statistics.median(r.output_tokens for r in trace) < 45
    per_10s = [0] * 180
    for r in trace:
        per_10s[int(r.arrival_s // 10)] += 1
    assert max(per_10s) / 10 > 8 * 4.0  # bursts near 10x the mean


def test_long_context_prompts_fit_a_shorter_context_by_one_factor():
    trace = long_context_trace(600.0, 3.4, seed=0)
    assert min(r.prompt_tokens for r in trace) >= 4000 and max(r.prompt_tokens for r in trace) <= 12000
    fitted, factor = fit_context(trace, 4096)
    assert factor < 0.5 and all(r.prompt_tokens + r.output_tokens < 4096 for r in fitted)


def test_a_diurnal_day_peaks_halfway():
    trace = diurnal_trace(3600.0, 5.0, 0.8, seed=0)
    night = sum(1 for r in trace if r.arrival_s < 600)
    noon = sum(1 for r in trace if 1500 <= r.arrival_s < 2100)
    assert noon > 4 * night
