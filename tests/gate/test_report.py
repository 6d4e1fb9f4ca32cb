"""The HTML report: verdicts, numbers, an embedded latency plot (or a note where matplotlib is missing)."""

import base64
import re
import sys
from dataclasses import asdict, replace

from tandem.gate.config import GateConfig
from tandem.gate.evidence import Evidence, judge
from tandem.gate.report import latency_plot_png, render_report
from tandem.gate.sides import Side

from .test_evidence import BASE, FAST, good_pairs

CONFIG = GateConfig(candidate="fast", min_latency_samples=40, min_accuracy_samples=30, min_error_samples=20)


def result_for(pairs, config=CONFIG):
    verdict = judge(Evidence(Side("baseline", BASE), Side("fast", FAST), tuple(pairs)), config)
    side = {"price_source": "pinned"}
    return {
        "command": "tandem gate --incumbent baseline --candidate fast", "model": "models/m",
        "finished_at": "2026-01-01T00:00:00+00:00", "verdict": verdict.to_dict(), "settings": asdict(config),
        "incumbent": {"name": "baseline", **side}, "candidate": {"name": "fast", **side},
        "mirror": {"mirrored": len(pairs)}, "teacher_forcing_off": "HTTP 400: no echo",
    }  # fmt: skip


def test_the_report_shows_verdicts_numbers_and_the_plot():
    pairs = good_pairs()
    html = render_report(result_for(pairs), pairs)
    assert '<span class="PASS">PASS</span>' in html
    for text in ("top-1 agreement", "teacher forcing off: HTTP 400: no echo", "$ per million output tokens",
                 "ttft", "r39", "tandem gate --incumbent baseline --candidate fast"):  # fmt: skip
        assert text in html, text
    png = base64.b64decode(re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html).group(1))
    assert png.startswith(b"\x89PNG")


def test_a_failed_judgement_still_renders():
    result = result_for(good_pairs())
    result["verdict"] = {"verdict": "FAIL", "reasons": ["the gate could not judge: boom"], "pairs": 0, "metrics": {}}
    html = render_report(result, [])
    assert '<span class="FAIL">FAIL</span>' in html and "the gate could not judge: boom" in html


def test_without_matplotlib_the_report_says_how_to_get_the_plot(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    pairs = good_pairs()
    html = render_report(result_for(pairs), pairs)
    assert "pip install &#39;tandem[report]&#39;" in html and "data:image/png" not in html


def test_the_plot_copes_with_no_latency_samples():
    pairs = [replace(p, incumbent=replace(p.incumbent, ttft_s=None, tpot_s=None)) for p in good_pairs(5)]
    assert latency_plot_png(pairs, {"median": 0.05}).startswith(b"\x89PNG")
