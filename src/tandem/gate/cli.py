"""`tandem gate`: judge a candidate recipe against the incumbent offline, on local replicas.

    tandem gate --incumbent baseline --candidate int8+kv-bf16+ngram --json gate.json --report gate.html

Exit status: 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 the gate could not run (bad input, a replica that
would not start). Torch is never imported here: the replicas and the Profile measurements are
subprocesses.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

__all__ = ["COMMANDS", "gate_command", "EXIT_CODES"]

EXIT_CODES = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 2}
EXIT_CANNOT_RUN = 3


class _CannotRun(click.ClickException):
    exit_code = EXIT_CANNOT_RUN


class _GateCommand(click.Command):
    """Bad flags exit 3, not click's 2 (which is INCONCLUSIVE here)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            exc.exit_code = EXIT_CANNOT_RUN
            raise


def _settings(path: str | None, candidate: str, min_samples: int | None, lossless: bool):
    import yaml

    from tandem.gate.config import GateConfigError, parse_gate_settings

    block: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise _CannotRun(f"{path}: cannot read the settings ({' '.join(str(exc).split())})") from None
        block = raw.get("gate", raw) if isinstance(raw, dict) else raw
        if not isinstance(block, dict):
            raise _CannotRun(f"{path}: the gate settings must be a mapping of fields")
        block = dict(block)
    block["candidate"] = candidate
    if min_samples is not None:
        block["min_samples"] = {"latency": min_samples, "accuracy": min_samples, "errors": min_samples}
    if lossless:
        block["accuracy"] = {**(block.get("accuracy") or {}), "lossless": True}
    try:
        return parse_gate_settings(block, where=path or "gate")
    except GateConfigError as exc:
        raise _CannotRun(str(exc)) from None


def _side(role: str, recipe: str, profile_file: str | None, price: float | None, model: str | None, threads: int):
    from tandem.gate.sides import Side
    from tandem.pricing import DEFAULT_PRICE
    from tandem.schedule.profiles import ProfileError, cached_profile, load_profile

    usd, source = (price, "given on the command line") if price is not None else DEFAULT_PRICE
    profile, error = None, None
    try:
        if profile_file is not None:
            profile = load_profile(profile_file)
        else:
            click.echo(f"Profile of the {role} ({recipe}): measuring, or from the cache ...", err=True)
            profile = cached_profile(model, recipe, threads)
    except ProfileError as exc:
        if profile_file is not None:
            raise _CannotRun(str(exc)) from None
        error = str(exc)  # no cost verdict (INCONCLUSIVE), said in the report; the rest still runs
        click.echo(f"warning: {exc}", err=True)
    return Side(recipe, profile, usd, error), source


def _summary(verdict: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    colors = {"PASS": "green", "FAIL": "red", "INCONCLUSIVE": "yellow"}
    table = Table(
        title=f"tandem gate: [{colors[verdict['verdict']]}]{verdict['verdict']}[/] ({verdict['pairs']} pairs)"
    )
    for column in ("metric", "verdict", "why"):
        table.add_column(column)
    for name, metric in verdict["metrics"].items():
        color = colors[metric["verdict"]]
        table.add_row(name, f"[{color}]{metric['verdict']}[/]", "\n".join(metric["reasons"]))
    Console().print(table)


@click.command("gate", cls=_GateCommand)
@click.option(
    "--model",
    "model_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="HF model directory (default: bundled)",
)
@click.option("--incumbent", required=True, help="the recipe serving today, e.g. baseline")
@click.option("--candidate", required=True, help="the recipe on trial, e.g. int8+kv-bf16+ngram")
@click.option("--requests", "num_requests", type=click.IntRange(min=1), default=200, show_default=True)
@click.option(
    "--concurrency", type=click.IntRange(min=1), default=4, show_default=True, help="requests in flight on each variant"
)
@click.option("--seed", type=int, default=0, show_default=True, help="workload draw (and sampling seeds)")
@click.option("--temperature", type=click.FloatRange(0, 2), default=0.0, show_default=True, help="0: greedy")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="torch threads per replica (default: half the cores each)",
)
@click.option(
    "--incumbent-profile",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="the incumbent's Profile JSON (default: measured once and cached)",
)
@click.option("--candidate-profile", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option(
    "--incumbent-price",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="$ per replica-hour (default: the pinned c7a.large price tandem bench uses)",
)
@click.option("--candidate-price", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option(
    "--settings",
    "settings_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="YAML with the gate block (tolerances, minimum samples, confidence, SLO)",
)
@click.option(
    "--min-samples",
    type=click.IntRange(min=2),
    default=None,
    help="pairs each metric needs (latency, accuracy, errors; default: the settings')",
)
@click.option("--lossless", is_flag=True, help="the candidate claims the incumbent's greedy output exactly")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None)
@click.option(
    "--report", "report_path", type=click.Path(dir_okay=False, writable=True), default=None, help="HTML report"
)
@click.option("--log-dir", type=click.Path(file_okay=False), default=None, help="replica logs (default: a temp dir)")
@click.option(
    "--trace",
    type=click.Path(),
    default=None,
    help="CSV of request lengths (columns ContextTokens,GeneratedTokens; default: the bundled Azure trace)",
)
def gate_command(
    model_dir, incumbent, candidate, num_requests, concurrency, seed, temperature, threads, incumbent_profile,
    candidate_profile, incumbent_price, candidate_price, settings_file, min_samples, lossless, json_path,
    report_path, log_dir, trace,
) -> None:  # fmt: skip
    """Run INCUMBENT and CANDIDATE side by side on the trace-shaped workload and judge latency, accuracy
    and unit cost. Exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 could not run."""
    from tandem.gate.offline import GateRunError, OfflineRun, run_variants
    from tandem.gate.pairs import PairLog
    from tandem.gate.private_files import write_private
    from tandem.gate.report import render_report
    from tandem.gate.state import Gate, GateState

    if trace is not None:
        from tandem.data.traces import read_trace

        try:
            read_trace(trace, timed=False)  # a bad trace fails here, before any replica starts
        except ValueError as exc:
            raise _CannotRun(str(exc)) from None
    config = _settings(settings_file, candidate, min_samples, lossless)
    threads = threads or max(1, (os.cpu_count() or 2) // 2)
    started = datetime.now(UTC)
    # Profiles of one-thread replicas are timed on each process's CPU clock: the two sides measure at
    # once (on a 2-core machine half the wait), as their replicas then run side by side.
    with ThreadPoolExecutor(max_workers=2 if threads == 1 else 1) as pool:
        sides = [
            pool.submit(_side, "incumbent", incumbent, incumbent_profile, incumbent_price, model_dir, threads),
            pool.submit(_side, "candidate", candidate, candidate_profile, candidate_price, model_dir, threads),
        ]
        (inc, inc_source), (cand, cand_source) = (side.result() for side in sides)
    run = OfflineRun(
        incumbent, candidate, model_dir, num_requests, concurrency, seed, temperature, threads,
        trace=Path(trace) if trace is not None else None,
    )  # fmt: skip
    click.echo(f"Running {num_requests} requests through {incumbent} and {candidate} ...", err=True)
    try:
        pair_run = run_variants(run, log_dir=Path(log_dir) if log_dir else None)
    except GateRunError as exc:
        raise _CannotRun(str(exc)) from None
    log = PairLog()
    for pair in pair_run.pairs:
        log.add(pair)
    gate = Gate(
        config, incumbent=inc, candidate=cand, pairs=log, started_at=time.monotonic(),
        mirror_counts=lambda: pair_run.mirror, teacher_forcing_off=lambda: pair_run.teacher_forcing_off,
        looks=1,  # offline: one judgement, on everything
    )  # fmt: skip
    gate.evaluate(time.monotonic(), final=True)
    verdict = gate.verdict.to_dict() if gate.verdict is not None else None
    overall = {GateState.PASSED: "PASS", GateState.INCONCLUSIVE: "INCONCLUSIVE"}.get(gate.state, "FAIL")
    if verdict is None:  # the judge itself failed: fail closed
        verdict = {"verdict": "FAIL", "reasons": [gate.decisions[-1].reason], "pairs": len(log), "metrics": {}}
    result = {
        "command": shlex.join(["tandem", *sys.argv[1:]]),
        "model": str(run.model_dir),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": list(os.getloadavg()),
        "verdict": verdict,
        "state": str(gate.state),
        "decisions": [d.to_dict() for d in gate.decisions],
        "settings": asdict(config),
        "workload": {
            "requests": num_requests,
            "concurrency": concurrency,
            "seed": seed,
            "temperature": temperature,
            "threads_per_replica": threads,
            "trace": trace or "bundled",
            "seconds": pair_run.seconds,
        },
        "incumbent": _side_dict(inc, inc_source),
        "candidate": _side_dict(cand, cand_source),
        "mirror": pair_run.mirror,
        "teacher_forcing_off": pair_run.teacher_forcing_off,
        "pairs": [p.to_dict() for p in pair_run.pairs],
    }
    if json_path:
        write_private(json_path, json.dumps(result, indent=1) + "\n")
    if report_path:
        write_private(report_path, render_report(result, pair_run.pairs))
    _summary(verdict)
    sys.exit(EXIT_CODES[overall])


def _side_dict(side, price_source: str) -> dict[str, Any]:
    return {
        "name": side.name,
        "usd_per_hour": side.usd_per_hour,
        "price_source": price_source,
        "profile": None if side.profile is None else json.loads(side.profile.to_json()),
        "profile_error": side.profile_error,
    }


COMMANDS = [gate_command]
