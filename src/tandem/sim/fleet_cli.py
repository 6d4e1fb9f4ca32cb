"""`tandem sim` for a fleet of models: `--trace MODEL=TRACE` repeated, `--variant MODEL:NAME=PROFILE.json[@PRICE]`.

The single-model command's options mean the same here (window, rate scale, SLO, policies, ticks);
`--node-memory-gb` packs every model's replicas together (tandem.sim.fleet). The table has one row
per scenario (a policy, one variant per model); the lines under it compare, for each model with
more than one variant, its variants with every other model at its first: the memory one replica
frees and the fleet's replica- and node-hours a day.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from tandem.sim.choices import names_from

__all__ = ["fleet_traces", "run_fleet_command"]

_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def fleet_traces(names: Sequence[str]) -> list[tuple[str, str]] | None:
    """[(model, trace)] when the traces are given as MODEL=TRACE (a fleet); None for one plain trace."""
    pairs = [name.partition("=") for name in names]
    fleet = [(model, trace) for model, sep, trace in pairs if sep and _MODEL.match(model) and trace]
    if not fleet:
        return None
    if len(fleet) != len(names):
        raise click.BadParameter("give every trace as MODEL=TRACE, or one plain trace", param_hint="--trace")
    models = [model for model, _ in fleet]
    if len(set(models)) != len(models):
        raise click.BadParameter("one trace per model", param_hint="--trace")
    return fleet


def _model_variants(specs: Sequence[str], models: Sequence[str]) -> dict[str, list[Any]]:
    from tandem.sim.cli import _variant

    out: dict[str, list[Any]] = {model: [] for model in models}
    for spec in specs:
        model, sep, rest = spec.partition(":")
        if not sep or model not in out or "=" not in rest:
            raise click.BadParameter(
                f"{spec!r}: a fleet's variants are MODEL:NAME=PROFILE.json[@PRICE] (models: {', '.join(models)})",
                param_hint="--variant",
            )
        variant = _variant(rest)
        if any(v.name == variant.name for v in out[model]):
            raise click.BadParameter(f"{model}: variant names must differ", param_hint="--variant")
        out[model].append(variant)
    missing = [model for model, variants in out.items() if not variants]
    if missing:
        raise click.BadParameter(f"no variant for model(s) {', '.join(missing)}", param_hint="--variant")
    return out


def _comparisons(rows: list[dict[str, Any]], models: Sequence[str], firsts: dict[str, str]) -> list[str]:
    """For each model with several variants: each of them against its first, the other models at theirs."""
    lines = []
    for model in models:
        for row in rows:
            chosen = row["variants"]
            others_first = all(chosen[m] == firsts[m] for m in models if m != model)
            if not others_first or chosen[model] == firsts[model]:
                continue
            base = next(
                r for r in rows if r["policy"] == row["policy"] and r["variants"] == {**chosen, model: firsts[model]}
            )
            new_m = next(m for m in row["models"] if m["model"] == model)
            old_m = next(m for m in base["models"] if m["model"] == model)
            freed = old_m["replica_memory_bytes"] - new_m["replica_memory_bytes"]
            line = (
                f"{row['policy']}: {model} on {new_m['variant']} instead of {old_m['variant']}: one replica "
                f"{'frees' if freed >= 0 else 'takes'} {abs(freed) / 2**20:,.0f} MiB "
                f"({new_m['replica_memory_bytes'] / 2**20:,.0f} vs {old_m['replica_memory_bytes'] / 2**20:,.0f}); "
                f"the fleet needs {row['replica_hours_per_day']:.1f} vs {base['replica_hours_per_day']:.1f} "
                "replica-h/day"
            )
            if "node_hours_per_day" in row:
                line += (
                    f", {row['node_hours_per_day']:.1f} vs {base['node_hours_per_day']:.1f} node-h/day "
                    f"(peak {row['peak_nodes']} vs {base['peak_nodes']} nodes)"
                )
            lines.append(line)
    return lines


def run_fleet_command(
    fleet: list[tuple[str, str]],
    variant_specs: Sequence[str],
    policies: str,
    *,
    start_s: float,
    duration_s: float | None,
    rate_scale: float,
    fit_context: bool,
    slo: tuple[float, float, float],
    node_memory_gb: float | None,
    node_accelerators: int,
    max_replicas: int,
    utilization: float,
    tick_s: float,
    warmup_s: float,
    admission_cap: bool,
    seed: int,
    json_path: str | None,
) -> None:
    from rich.console import Console
    from rich.table import Table

    from tandem.schedule.packing import NodeShape
    from tandem.sim.cli import _load_trace
    from tandem.sim.experiment import POLICY_NAMES, Slo
    from tandem.sim.fleet import FleetModel, run_fleet
    from tandem.sim.report import write_json
    from tandem.sim.simulator import SimConfig
    from tandem.sim.trace import compress
    from tandem.sim.trace import fit_context as fit

    console = Console(stderr=True)
    models = [model for model, _ in fleet]
    variants = _model_variants(variant_specs, models)
    policy_list = names_from(policies, POLICY_NAMES, "--policies")
    try:
        fleet_models, labels = [], {}
        for model, trace_name in fleet:
            trace, labels[model] = _load_trace(trace_name, start_s, duration_s, seed)
            contexts = [v.profile.max_model_len for v in variants[model] if v.profile.max_model_len]
            if fit_context and contexts and trace:
                trace, _ = fit(trace, min(contexts))
            fleet_models.append(FleetModel(model, tuple(compress(trace, rate_scale)), tuple(variants[model])))
        node = NodeShape(int(node_memory_gb * 2**30), node_accelerators) if node_memory_gb is not None else None
        slo_obj = Slo(*slo)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    window = duration_s / rate_scale if duration_s else min(m.trace[-1].arrival_s for m in fleet_models)
    config = SimConfig(tick_s=tick_s, warmup_s=warmup_s, admission_cap=admission_cap)
    started = time.perf_counter()
    try:
        scenarios = run_fleet(
            fleet_models, policy_list, slo_obj, duration_s=window, config=config, node=node,
            max_replicas=max_replicas, utilization=utilization, progress=lambda m: console.log(m),
        )  # fmt: skip
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    wall = time.perf_counter() - started
    rows = [s.row() for s in scenarios]

    title = (
        f"tandem sim: a fleet of {len(models)} models, {window / 3600:.2f} h; SLO TTFT {slo[0]:g} s, TPOT {slo[1]:g} s"
    )
    table = Table(title=title)
    for column in ["policy", *models, *(f"{m} replica-h/day" for m in models), "replica-h/day"]:
        table.add_column(column)
    if node is not None:
        for column in ("node-h/day", "peak nodes", "mean GiB held"):
            table.add_column(column)
    table.add_column("SLO met (worst model)")
    table.add_column("lost")
    for row in rows:
        cells = [row["policy"], *(row["variants"][m] for m in models)]
        cells += [f"{m['replica_hours_per_day']:.1f}" for m in row["models"]]
        cells.append(f"{row['replica_hours_per_day']:.1f}")
        if node is not None:
            cells += [f"{row['node_hours_per_day']:.1f}", str(row["peak_nodes"]), f"{row['mean_memory_gib']:.2f}"]
        cells += [f"{row['slo_attainment_min']:.2%}", str(row["lost"])]
        table.add_row(*cells)
    out = Console(width=None if sys.stdout.isatty() else 200)
    out.print(table)
    firsts = {model: variants[model][0].name for model in models}
    comparisons = _comparisons(rows, models, firsts)
    for line in comparisons:
        out.print(line)
    console.print(f"{len(scenarios)} scenarios in {wall:.1f} s")
    if json_path:
        write_json(
            json_path,
            {
                "command": shlex.join(["tandem", *sys.argv[1:]]) if sys.argv[1:2] == ["sim"] else "tandem sim",
                "traces": {
                    m.name: {"trace": t, "label": labels[m.name], "requests": len(m.trace)}
                    for m, (_, t) in zip(fleet_models, fleet, strict=True)
                },  # fmt: skip
                "window_s": window,
                "rate_scale": rate_scale,
                "slo": {"ttft_s": slo[0], "tpot_s": slo[1], "target": slo[2]},
                "node": {"memory_gb": node_memory_gb, "accelerators": node_accelerators} if node else None,
                "replica_memory": "Profile.memory_bytes: weights + KV budget",
                "comparisons": comparisons,
                "wall_s": wall,
                "scenarios": rows,
            },
        )
