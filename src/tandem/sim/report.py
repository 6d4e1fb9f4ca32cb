"""What `tandem sim` writes: a rich table, the JSON payload (`{"results": [...]}`), an HTML report.

Every row names its Profile's source (measured here, imported, projected with its factor), so a
projected row is never read as a measurement; every output carries the data's attribution.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

__all__ = ["results_tables", "write_html", "write_json"]

_COST = (
    ("variant", "variant", str),
    ("policy", "policy", str),
    ("router", "router", str),
    ("source", "profile_source", str),
    ("replica-h/day", "replica_hours_per_day", "{:.1f}"),
    ("x oracle", "replica_hours_vs_oracle", "{:.2f}"),
    ("accel-h/day", "accelerator_hours_per_day", "{:.1f}"),
    ("node-h/day", "node_hours_per_day", "{:.1f}"),
    ("peak", "peak_replicas", "{}"),
    ("mean", "mean_replicas", "{:.2f}"),
    ("min", "min_replicas", "{}"),
    ("$/day", "cost_usd_per_day", "{:.2f}"),
    ("$/M out", "usd_per_million_output_tokens", "{:.3f}"),
    ("scale events", "scale_events", "{}"),
)
_SERVICE = (
    ("variant", "variant", str),
    ("policy", "policy", str),
    ("router", "router", str),
    ("SLO met", "slo_attainment", "{:.2%}"),
    ("prefix hit", "prefix_hit_rate", "{:.1%}"),
    ("TTFT p50", "ttft_p50_s", "{:.2f}s"),
    ("TTFT p99", "ttft_p99_s", "{:.2f}s"),
    ("TPOT p50", "tpot_p50_s", "{:.3f}s"),
    ("TPOT p99", "tpot_p99_s", "{:.3f}s"),
    ("served", "served", "{}"),
    ("lost", "lost", "{}"),
    ("unserved", "unserved", "{}"),
)
_COLUMNS = _COST + _SERVICE[2:]


def _cell(value: Any, fmt: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt(value) if callable(fmt) else fmt.format(value)


def _columns(rows: Sequence[dict], group=_COLUMNS) -> list[tuple[str, str, Any]]:
    """Drop the columns no row has (no packing: no node-hours; no prices: no dollars)."""
    return [c for c in group if any(row.get(c[1]) is not None for row in rows)]


def results_tables(rows: Sequence[dict], title: str) -> list[Table]:
    """Two tables (what the fleet costs; how it served), narrow enough for a terminal."""
    tables = []
    for caption, group in ((f"{title}: cost", _COST), (f"{title}: service", _SERVICE)):
        table = Table(title=caption)
        columns = _columns(rows, group)
        for header, _, _ in columns:
            table.add_column(header, justify="left" if header in ("variant", "policy", "router", "source") else "right")
        for row in rows:
            table.add_row(*(_cell(row.get(key), fmt) for _, key, fmt in columns))
        tables.append(table)
    return tables


def write_json(path: str | Path, payload: dict) -> None:
    Path(path).write_text(json.dumps(payload, indent=2, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def write_html(path: str | Path, payload: dict, png: bytes | None) -> None:
    """A self-contained page: the setup, the results table, the figure (inlined) and the attribution."""
    rows = payload["results"]
    columns = _columns(rows)
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(row.get(k), f))}</td>" for _, k, f in columns) + "</tr>"
        for row in rows
    )
    sources = "".join(
        f"<li><b>{html.escape(row['variant'])}</b> ({html.escape(row['profile_source'])}): "
        f"{html.escape(row['profile_source_note'])}</li>"
        for row in {r["variant"]: r for r in rows}.values()
    )
    setups = "".join(
        f"<li>{html.escape(r['variant'])} x {html.escape(r['policy'])}: {html.escape(json.dumps(r['setup']))}</li>"
        for r in rows
    )
    figure = (
        f'<img alt="replicas over time against demand" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        if png
        else "<p>(no figure: install matplotlib, <code>pip install 'tandem[plots]'</code>)</p>"
    )
    trace, slo = payload["trace"], payload["slo"]
    attribution = "".join(f"<li>{html.escape(a)}</li>" for a in payload["attribution"])
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>tandem sim</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:nth-child(-n+3){{text-align:left}}
img{{max-width:100%}}</style></head><body>
<h1>tandem sim: fleet economics</h1>
<p>Trace <b>{html.escape(str(trace["name"]))}</b>: {trace["requests"]} requests over {trace["duration_s"]:.0f} s
(rate scale {trace["rate_scale"]:g}, lengths x{trace["length_scale"]:.3g}). SLO: TTFT &le; {slo["ttft_s"]:g} s and
TPOT &le; {slo["tpot_s"]:g} s; static-peak sized for {slo["target"]:.0%} at the peak minute.</p>
<table><tr>{head}</tr>{body}</table>
<h2>Replicas over time against demand</h2>{figure}
<h2>Profiles</h2><ul>{sources}</ul>
<h2>Policy setups</h2><ul>{setups}</ul>
<h2>Data</h2><ul>{attribution}</ul>
<p><code>{html.escape(payload["command"])}</code></p>
</body></html>
"""
    Path(path).write_text(page)
