"""`tandem sim`: fleet economics. A trace through every (variant, policy) pair on a virtual clock.

    tandem sim --trace conv --variant fast=fast.json@0.10 --variant base=base.json@0.10 \\
        --policies static-peak,hpa,kpa,capacity,oracle --slo-ttft-s 2 --slo-tpot-s 0.1 \\
        --json out.json --plot out.png --report out.html

A fleet of models on shared nodes (tandem.sim.fleet): `--trace MODEL=TRACE` once per model and its
variants as `--variant MODEL:NAME=PROFILE.json[@PRICE]`; every combination of one variant per model
is simulated under each policy and packed onto nodes of `--node-memory-gb`.

    tandem sim --trace code=conv --trace chat=bursty --variant code:base=base.json \
        --variant code:int8=int8.json --variant chat:base=chat.json --policies capacity --node-memory-gb 1

Torch-free: it imports the scheduling layer and the simulator only.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

import click

from tandem.sim.choices import names_from

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
    "trace_names",
    multiple=True,
    default=("conv",),
    show_default=True,
    help="'conv' (the bundled Azure conversation trace), 'bursty' (synthetic), a CSV with "
    "TIMESTAMP,ContextTokens,GeneratedTokens, or a Mooncake JSON-lines trace (.jsonl: timestamp ms, "
    "input_length, output_length). MODEL=TRACE, repeated: a fleet of models (variants as MODEL:NAME=...)",
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
@click.option(
    "--router",
    "routers",
    default="least-outstanding",
    show_default=True,
    help="The gateway's router(s), comma-separated, each simulated with every policy: least-outstanding, "
    "prefix-affinity, kv-aware (a Mooncake trace's hash_ids give the replicas a prefix block cache), ...",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic trace.")
@click.option(
    "--tenant-mix",
    default=None,
    metavar="NAME:SHARE[:PRIORITY],...",
    help="Draw each request into a priority class (interactive:0.3,batch:0.7), admit higher classes first at the "
    "gateway, and report SLO attainment per class.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None)
@click.option("--report", "report_path", type=click.Path(dir_okay=False, writable=True), default=None)
def sim_command(
    trace_names,
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
    routers,
    seed,
    tenant_mix,
    json_path,
    plot_path,
    report_path,
) -> None:
    """Simulate a trace through every (variant, policy) pair: replica-hours, SLO attainment, cost."""
    from rich.console import Console

    from tandem.sim.fleet_cli import fleet_traces

    fleet = fleet_traces(trace_names)
    if fleet is not None:
        from tandem.sim.fleet_cli import run_fleet_command

        return run_fleet_command(
            fleet, variant_specs, policies, start_s=start_s, duration_s=duration_s, rate_scale=rate_scale,
            fit_context=fit_context, slo=(slo_ttft_s, slo_tpot_s, slo_target), node_memory_gb=node_memory_gb,
            node_accelerators=node_accelerators, max_replicas=max_replicas, utilization=target_utilization,
            tick_s=tick_s, warmup_s=warmup_s, admission_cap=admission_cap, seed=seed, json_path=json_path,
        )  # fmt: skip
    if len(trace_names) != 1:
        raise click.BadParameter("one trace, or MODEL=TRACE for each model of a fleet", param_hint="--trace")
    (trace_name,) = trace_names

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
    from tandem.schedule.routers import ROUTER_NAMES

    router_list = names_from(routers, ROUTER_NAMES, "--router")
    policy_list = names_from(policies, POLICY_NAMES, "--policies")
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
        if tenant_mix:
            from tandem.sim.tenant_mix import assign_classes, parse_tenant_mix

            trace = assign_classes(trace, parse_tenant_mix(tenant_mix), seed)
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
            routers=router_list,
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
    for row in rows:
        if row.get("slo_attainment_by_class"):
            shares = ", ".join(f"{name} {met:.1%}" for name, met in row["slo_attainment_by_class"].items())
            out.print(f"SLO met per class, {row['variant']} / {row['policy']}: {shares}")
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
