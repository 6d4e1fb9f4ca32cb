# ruff: noqa: E501 (the HTML template's lines)
"""The gate's HTML report: the verdicts, the numbers behind them, and the latency distributions.

One self-contained file (the plot is an embedded PNG). matplotlib is the optional extra
`tandem[report]`; without it the report says so where the plot would be.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import numpy as np

from tandem.gate.latency import latency_samples
from tandem.gate.pairs import Pair

__all__ = ["latency_plot_png", "render_report"]

_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tandem gate: {{ r.candidate.name }} vs {{ r.incumbent.name }}</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: .6em 0 1.2em; }
td, th { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } code { background: #f5f5f5; padding: 0 .2em; }
.PASS { color: #1a7f37; font-weight: 600; } .FAIL { color: #cf222e; font-weight: 600; }
.INCONCLUSIVE { color: #9a6700; font-weight: 600; } .note { color: #555; }
</style></head><body>
<h1>tandem gate: <code>{{ r.candidate.name }}</code> vs <code>{{ r.incumbent.name }}</code>:
<span class="{{ v.verdict }}">{{ v.verdict }}</span></h1>
<p class="note">{{ r.model }} &middot; {{ v.pairs }} pairs &middot; {{ r.finished_at }}
{% if r.command %}&middot; <code>{{ r.command }}</code>{% endif %}</p>
<ul>{% for reason in v.reasons %}<li>{{ reason }}</li>{% endfor %}</ul>

<h2>Verdicts</h2>
<table><tr><th>metric</th><th>verdict</th><th>samples</th><th>why</th></tr>
{% for name, m in v.metrics.items() %}<tr><td>{{ name }}</td><td class="{{ m.verdict }}">{{ m.verdict }}</td>
<td>{{ m.samples }}</td><td>{% for reason in m.reasons %}{{ reason }}<br>{% endfor %}</td></tr>{% endfor %}
</table>

{% if v.metrics %}
<h2>Latency</h2>
<table><tr><th>metric</th><th>statistic</th><th>candidate / incumbent</th><th>bounds ({{ confidence }})</th>
<th>tolerance</th><th>verdict</th></tr>
{% for metric in ("ttft", "tpot") %}{% set s = v.metrics.latency.stats.get(metric, {}) %}
{% for stat in ("median", "p95") %}{% if s.get(stat) %}<tr><td>{{ metric }}</td><td>{{ stat }}</td>
<td>{{ "%.3f"|format(s[stat].ratio) }}x</td><td>{{ "%.3f"|format(s[stat].low) }}-{{ "%.3f"|format(s[stat].high) }}</td>
<td>{{ "%.2f"|format(1 + s[stat].tolerance) }}x</td><td class="{{ s[stat].verdict }}">{{ s[stat].verdict }}</td></tr>
{% endif %}{% endfor %}{% endfor %}</table>
<table><tr><th>metric</th><th>pairs</th><th>incumbent p50</th><th>candidate p50</th><th>incumbent p95</th>
<th>candidate p95</th></tr>
{% for metric in ("ttft", "tpot") %}{% set s = v.metrics.latency.stats.get(metric, {}) %}
{% if s.get("incumbent_p50_s") is not none %}<tr><td>{{ metric }}</td><td>{{ s.samples }}</td>
<td>{{ ms(s.incumbent_p50_s) }}</td><td>{{ ms(s.candidate_p50_s) }}</td><td>{{ ms(s.incumbent_p95_s) }}</td>
<td>{{ ms(s.candidate_p95_s) }}</td></tr>{% endif %}{% endfor %}</table>
{% if plot %}<img alt="latency distributions" src="data:image/png;base64,{{ plot }}" style="max-width:100%">
{% else %}<p class="note">{{ plot_note }}</p>{% endif %}

<h2>Accuracy</h2>
{% set a = v.metrics.accuracy.stats %}
<table>
<tr><th>method</th><td>{% for method, n in a.get("methods", {}).items() %}{{ method }}: {{ n }} pairs<br>{% endfor %}
{% if r.teacher_forcing_off %}<span class="note">teacher forcing off: {{ r.teacher_forcing_off }}</span>{% endif %}</td></tr>
{% if a.get("top1_agreement") %}<tr><th>top-1 agreement</th><td>{{ pct(a.top1_agreement.rate) }}
(bounds {{ pct(a.top1_agreement.low) }}-{{ pct(a.top1_agreement.high) }}) over {{ a.top1_agreement.positions }} tokens;
threshold {{ pct(a.top1_agreement.threshold) }}</td></tr>{% endif %}
{% if a.get("logprob_gap") %}<tr><th>log-likelihood gap</th><td>{{ "%+.4f"|format(a.logprob_gap.nats_per_token) }}
nats/token (bounds {{ "%+.4f"|format(a.logprob_gap.low) }} to {{ "%+.4f"|format(a.logprob_gap.high) }});
at most {{ a.logprob_gap.threshold }}</td></tr>{% endif %}
{% if a.get("exact_match") %}<tr><th>greedy exact match</th><td>{{ a.exact_match.identical }} / {{ a.exact_match.greedy_pairs }}
{% if r.settings.lossless %}(declared lossless: all required){% endif %}</td></tr>{% endif %}
</table>

<h2>Unit cost</h2>
{% set c = v.metrics.cost.stats %}
{% if c.get("incumbent") %}<table><tr><th></th><th>recipe</th><th>hardware</th><th>$ / replica-hour</th>
<th>batch at the SLO</th><th>output tokens/s</th><th>$ per million output tokens</th></tr>
{% for side in ("incumbent", "candidate") %}{% set x = c[side] %}<tr><td>{{ side }}</td><td>{{ x.recipe }}</td>
<td>{{ x.hardware }}</td><td>{{ x.usd_per_hour }}</td><td>{{ x.batch }}{% if not x.meets_slo %} (misses the SLO){% endif %}</td>
<td>{{ "%.1f"|format(x.output_tokens_per_s) }}</td><td>{{ "%.4f"|format(x.usd_per_million_tokens) }}</td></tr>{% endfor %}
</table><p class="note">Capacity at {{ (c.tpot_slo_s * 1000)|round(1) }} ms per output token; prices:
{{ r.incumbent.price_source }}{% if r.candidate.price_source != r.incumbent.price_source %} / {{ r.candidate.price_source }}{% endif %}.</p>
{% else %}<p class="note">{{ v.metrics.cost.reasons|join("; ") }}</p>{% endif %}

{% endif %}
<h2>Errors and traffic</h2>
<table>{% for key, value in r.mirror.items() %}<tr><th>{{ key }}</th><td>{{ value }}</td></tr>{% endfor %}
{% if v.metrics %}<tr><th>candidate errors</th><td>{{ v.metrics.errors.reasons|join("; ") }}</td></tr>{% endif %}</table>

<h2>Pairs</h2>
<table><tr><th>request</th><th>tokens</th><th>TTFT inc / cand</th><th>TPOT inc / cand</th><th>agreement</th>
<th>identical</th><th>error</th></tr>
{% for p in pairs %}<tr><td>{{ p.request_id }}</td><td>{{ p.incumbent.completion_tokens }} / {{ p.candidate.completion_tokens }}</td>
<td>{{ ms(p.incumbent.ttft_s) }} / {{ ms(p.candidate.ttft_s) }}</td><td>{{ ms(p.incumbent.tpot_s) }} / {{ ms(p.candidate.tpot_s) }}</td>
<td>{% if p.agreement %}{{ p.agreement.agree }}/{{ p.agreement.positions }} ({{ p.agreement.method }}){% endif %}</td>
<td>{{ "yes" if p.comparable and p.incumbent.text == p.candidate.text else "no" }}</td>
<td>{{ p.candidate.error or p.incumbent.error or "" }}</td></tr>{% endfor %}
</table>
</body></html>
"""


def _ms(seconds: float | None) -> str:
    return "" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1000:.1f} ms"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def latency_plot_png(pairs: Sequence[Pair], tolerances: Mapping[str, float]) -> bytes:
    """ECDFs of TTFT and TPOT for both variants, and the paired log-ratios, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), dpi=100)
    try:
        for ax, metric, label in ((axes[0], "ttft", "time to first token"), (axes[1], "tpot", "time per output token")):
            inc, cand = latency_samples(pairs, metric)
            for values, name, color in ((inc, "incumbent", "#57606a"), (cand, "candidate", "#0969da")):
                if len(values):
                    xs = np.sort(values) * 1000
                    ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=name, color=color)
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(f"{label} (ms)")
            ax.set_ylabel("fraction of requests")
            ax.axhline(0.95, color="#bbb", lw=0.8, ls=":")
            if ax.lines[:-1]:  # some variant had values (the last line is the p95 guide)
                ax.legend(loc="lower right")
            ax.grid(alpha=0.3)
        ax = axes[2]
        for metric, color in (("ttft", "#8250df"), ("tpot", "#bf8700")):
            inc, cand = latency_samples(pairs, metric)
            if len(inc):
                ax.hist(np.log(cand / inc), bins=30, alpha=0.55, color=color, label=f"{metric}: log(cand / inc)")
        ax.axvline(0, color="#57606a", lw=1)
        ax.axvline(math.log1p(tolerances["median"]), color="#cf222e", lw=1, ls="--", label="median tolerance")
        ax.set_xlabel("per-request log-ratio (< 0: candidate faster)")
        ax.set_ylabel("pairs")
        ax.legend(loc="upper right", fontsize=8)
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format="png")
        return out.getvalue()
    finally:
        plt.close(fig)


def render_report(result: Mapping[str, Any], pairs: Sequence[Pair]) -> str:
    """The HTML page for a gate result (the dict `tandem gate --json` writes) and its pairs."""
    settings = result["settings"]
    plot, plot_note = "", ""
    try:
        tolerances = {"median": settings["latency_median_tolerance"]}
        plot = base64.b64encode(latency_plot_png(pairs, tolerances)).decode()
    except ImportError:
        plot_note = "The latency plot needs matplotlib: pip install 'tandem[report]'."
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(_TEMPLATE)
    return template.render(
        r=result, v=result["verdict"], pairs=pairs, plot=plot, plot_note=plot_note, ms=_ms, pct=_pct,
        confidence=f"one-sided: {settings['confidence']:.0%} for a PASS, Bonferroni-corrected for a FAIL",
    )  # fmt: skip
