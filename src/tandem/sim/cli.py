"""`tandem sim`: fleet economics. A trace through every (variant, policy) pair on a virtual clock.

    tandem sim --trace conv --variant fast=fast.json@0.10 --variant base=base.json@0.10 \\
        --policies static-peak,hpa,kpa,capacity,oracle --slo-ttft-s 2 --slo-tpot-s 0.1 \\
        --json out.json --plot out.png --report out.html

Torch-free: it imports the scheduling layer and the simulator only.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click

__all__ = ["sim_command"]


def _variant(spec: str):
    """NAME=PROFILE.json[@PRICE_PER_REPLICA_HOUR] -> SimVariant."""
    from tandem.contracts import Profile
    from tandem.sim.experiment import SimVariant

    def bad(message: str) -> click.BadParameter:
        return click.BadParameter(message, param_hint="--variant")

    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise bad(f"{spec!r}: expected NAME=PROFILE.json[@PRICE_PER_HOUR]")
    path, at, price_text = rest.rpartition("@") if "@" in rest else (rest, "", "")
    price = None
    if at:
        try:
            price = float(price_text)
        except ValueError:
            price = -1.0
        if not price >= 0:
            raise bad(f"{spec!r}: the price after '@' must be dollars per hour >= 0")
    try:
        profile = Profile.from_json(Path(path).read_text())
    except OSError as exc:
        raise bad(f"{path}: cannot read the Profile ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise bad(f"{path}: not a Profile JSON ({exc})") from None
    return SimVariant(name, profile, price)


def _load_trace(name: str, start_s: float, duration_s: float | None, seed: int):
    from tandem.sim.trace import bursty_trace, load_trace, trace_path

    if name == "bursty":
        lengths = [(r.prompt_tokens, r.output_tokens) for r in load_trace()]
        mean_rate = len(lengths) / 3600.0
        trace = bursty_trace(mean_rate, duration_s or 3600.0, lengths, seed=seed)
        return [r for r in trace if r.arrival_s >= start_s], "bursty (synthetic: 10 s bursts at 10x the mean)"
    return load_trace(trace_path(name), start_s, duration_s), name


@click.command("sim")
@click.option(
    "--trace",
    "trace_name",
    default="conv",
    show_default=True,
    help="'conv' (the bundled Azure conversation trace), 'bursty' (synthetic), a CSV with "
    "TIMESTAMP,ContextTokens,GeneratedTokens, or a Mooncake JSON-lines trace (.jsonl: timestamp ms, "
    "input_length, output_length)",
)
@click.option("--start-s", type=click.FloatRange(min=0), default=0.0, help="Start this far into the trace.")
@click.option("--duration-s", type=click.FloatRange(min=0, min_open=True), default=None, help="Only this long.")
@click.option(
    "--rate-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Multiply the arrival rate (2: the trace plays twice as fast, in half the time)",
)
@click.option("--fit-context", is_flag=True, help="Scale lengths so the trace's p99 fits every context.")
@click.option(
    "--variant",
    "variant_specs",
    multiple=True,
    required=True,
    metavar="NAME=PROFILE.json[@PRICE]",
    help="A variant's Profile; PRICE: dollars per replica-hour (all its accelerators). Repeatable.",
)
@click.option("--policies", default="static-peak,hpa,kpa,capacity", show_default=True)
@click.option("--slo-ttft-s", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True)
@click.option("--slo-tpot-s", type=click.FloatRange(min=0, min_open=True), default=0.1, show_default=True)
@click.option(
    "--slo-target",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.99,
    show_default=True,
    help="Share of requests within the SLO that static-peak is sized for at the peak minute",
)
@click.option(
    "--node-memory-gb",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Pack replicas onto nodes of this much memory (first-fit decreasing); adds node-hours",
)
@click.option("--node-accelerators", type=click.IntRange(min=0), default=0, help="Accelerators per node (0: ignore).")
@click.option("--max-replicas", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--target-utilization",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.7,
    show_default=True,
    help="hpa's and kpa's target concurrency as a share of the SLO batch (Knative's default)",
)
@click.option("--tick-s", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True)
@click.option(
    "--warmup-s",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Replay the trace's first seconds before it, so the fleet starts sized (longer than hpa's 300 s window)",
)
@click.option(
    "--admission-cap/--no-admission-cap",
    default=False,
    show_default=True,
    help="The router holds each replica to the SLO batch and the prompt-token budget of the live length mix "
    "(requests queue at the gateway)",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic trace.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None)
@click.option("--report", "report_path", type=click.Path(dir_okay=False, writable=True), default=None)
def sim_command(
    trace_name,
    start_s,
    duration_s,
    rate_scale,
    fit_context,
    variant_specs,
    policies,
    slo_ttft_s,
    slo_tpot_s,
    slo_target,
    node_memory_gb,
    node_accelerators,
    max_replicas,
    target_utilization,
    tick_s,
    warmup_s,
    admission_cap,
    seed,
    json_path,
    plot_path,
    report_path,
) -> None:
    """Simulate a trace through every (variant, policy) pair: replica-hours, SLO attainment, cost."""
    from rich.console import Console

    from tandem.data import ATTRIBUTION, CONVERSATION_TRACE
    from tandem.schedule.packing import NodeShape
    from tandem.sim.experiment import POLICY_NAMES, Slo, run_experiment
    from tandem.sim.report import results_tables, write_html, write_json
    from tandem.sim.simulator import SimConfig
    from tandem.sim.trace import compress
    from tandem.sim.trace import fit_context as fit

    console = Console(stderr=True)
    variants = [_variant(spec) for spec in variant_specs]
    if len({v.name for v in variants}) != len(variants):
        raise click.BadParameter("variant names must differ", param_hint="--variant")
    policy_list = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in policy_list if p not in POLICY_NAMES]
    if unknown or not policy_list:
        raise click.BadParameter(
            f"unknown {', '.join(unknown) or 'empty'} (known: {', '.join(POLICY_NAMES)})", param_hint="--policies"
        )
    try:
        trace, label = _load_trace(trace_name, start_s, duration_s, seed)
        if not trace:
            raise ValueError(f"{trace_name}: no requests in the chosen window")
        length_scale = 1.0
        if fit_context:
            contexts = [v.profile.max_model_len for v in variants if v.profile.max_model_len]
            if contexts:
                trace, length_scale = fit(trace, min(contexts))
        trace = compress(trace, rate_scale)
        node = None
        if node_memory_gb is not None:
            node = NodeShape(int(node_memory_gb * 2**30), node_accelerators)
        slo = Slo(slo_ttft_s, slo_tpot_s, slo_target)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    duration = duration_s / rate_scale if duration_s else trace[-1].arrival_s
    for v in variants:
        context = v.profile.max_model_len
        too_long = sum(1 for r in trace if context and r.prompt_tokens + r.output_tokens > context)
        if too_long:
            console.print(
                f"[yellow]note:[/] {too_long} requests exceed {v.name}'s {context}-token "
                "context; simulated at its Profile's speeds anyway (--fit-context scales lengths)"
            )

    config = SimConfig(tick_s=tick_s, warmup_s=warmup_s, admission_cap=admission_cap)
    started = time.perf_counter()
    try:
        results = run_experiment(
            trace,
            variants,
            policy_list,
            slo,
            duration_s=duration,
            config=config,
            node=node,
            max_replicas=max_replicas,
            utilization=target_utilization,
            progress=lambda m: console.log(m),
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    wall = time.perf_counter() - started
    rows = [r.row() for r in results]
    oracle = {row["variant"]: row["replica_hours"] for row in rows if row["policy"] == "oracle"}
    for row in rows:  # every policy against the clairvoyant lower bound, when it ran
        bound = oracle.get(row["variant"])
        row["replica_hours_vs_oracle"] = row["replica_hours"] / bound if bound else None
    simulated = sum(r["simulated_s"] for r in rows)

    attribution = []
    if trace_name in ("conv", "bursty"):
        attribution.append(ATTRIBUTION[CONVERSATION_TRACE])
    for v in variants:
        note = v.profile.extra.get("attribution")
        if note and note not in attribution:
            attribution.append(note)
    title = (
        f"tandem sim: {label}, {len(trace)} requests, {duration / 3600:.2f} h; "
        f"SLO TTFT {slo_ttft_s:g} s, TPOT {slo_tpot_s:g} s"
    )
    out = Console(width=None if sys.stdout.isatty() else 160)  # a pipe or a file gets every column
    for table in results_tables(rows, title):
        out.print(table)
    for line in attribution:
        out.print(f"Data: {line}")
    console.print(f"{len(rows)} simulations in {wall:.1f} s: {simulated / wall:,.0f} simulated seconds per wall second")

    payload = {
        "command": shlex.join(["tandem", *sys.argv[1:]]) if sys.argv[1:2] == ["sim"] else "tandem sim",
        "trace": {
            "name": trace_name,
            "label": label,
            "requests": len(trace),
            "duration_s": duration,
            "start_s": start_s,
            "rate_scale": rate_scale,
            "length_scale": length_scale,
        },
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s, "target": slo_target},
        "node": {"memory_gb": node_memory_gb, "accelerators": node_accelerators} if node else None,
        "attribution": attribution,
        "wall_s": wall,
        "simulated_s_per_wall_s": simulated / wall if wall else None,
        "results": rows,
    }
    png = None
    if plot_path or report_path:
        from tandem.sim.plot import PlotUnavailable, plot_png

        try:
            png = plot_png(results, title)
        except PlotUnavailable as exc:
            if plot_path:
                raise click.ClickException(str(exc)) from None
            console.print(f"[yellow]note:[/] {exc}; the report has no figure")
    if plot_path and png:
        Path(plot_path).write_bytes(png)
    if json_path:
        write_json(json_path, payload)
    if report_path:
        write_html(report_path, payload, png)
