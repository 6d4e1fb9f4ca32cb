"""Bench rows in worker processes, run in rounds: one process per row, each row once per round.

A shared machine has slow spells that last longer than one row's runs; rows measured one after
another then compare a slow spell with a quiet one (two runs of the same bench gave the best recipe
1.59x and 1.29x baseline). Rounds spread every spell over all rows. Each row lives in its own
process, as a replica does, so rows never share an allocator, caches or kernel caches; a row's
process sits blocked on its pipe while the others run. `run_engine` times one run of the
workload through an engine (tandem.optimize.bench summarizes the runs; it imports this module, never
the other way round).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.engine import Engine
    from tandem.workload import BenchRequest

__all__ = ["RowSpec", "BenchWorkerError", "Timings", "run_engine", "run_rounds"]

# Between runs: time for the previous row's OpenMP threads to stop spinning and sleep.
SETTLE_S = 0.3

Timings = list[tuple[float, float, float, int]]  # (arrival, first token, finish, output tokens) per request


def run_engine(engine: Engine, requests: list[BenchRequest]) -> Timings:
    """All `requests` at once through `engine`, greedy, exactly max_tokens each."""
    from tandem.engine import SamplingParams

    start = time.perf_counter()
    ids = [
        engine.add_request(r.prompt_ids, SamplingParams.greedy_params(r.max_tokens, ignore_eos=True)) for r in requests
    ]
    first: dict[str, float] = {}
    done: dict[str, tuple[float, int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            now = time.perf_counter()
            first.setdefault(out.request_id, now)
            if out.finished:
                done[out.request_id] = (now, len(out.token_ids))
    return [(start, first[i], done[i][0], done[i][1]) for i in ids]


class BenchWorkerError(RuntimeError):
    """A bench row's process failed; the message names the row and the cause."""


@dataclass(frozen=True)
class RowSpec:
    name: str  # a tandem recipe, or "hf-sequential" / "hf-static-batch"
    model_dir: str | None
    max_num_seqs: int
    num_requests: int
    seed: int
    hf_batch_size: int = 8
    trace: str | None = None  # a CSV of request lengths; None: the bundled conversation trace


def _row_runner(spec: RowSpec):
    """Build the row's engine (or transformers model), warm it up; return (run, stats)."""
    from tandem.engine import Engine, EngineConfig
    from tandem.model.loader import load_model
    from tandem.optimize.registry import apply_recipe
    from tandem.workload import BenchRequest, load_workload

    probe = load_model(spec.model_dir)
    max_len = min(probe.config.max_position_embeddings, 2048)
    trace = None if spec.trace is None else Path(spec.trace)
    requests = load_workload(probe.tokenizer, max_len, spec.num_requests, seed=spec.seed, trace=trace)
    # Warm-up: every prompt once with a few output tokens, so kernel creation for each shape is not timed.
    warmup = [BenchRequest(r.prompt_ids, min(r.max_tokens, 3)) for r in requests]
    if spec.name in ("hf-sequential", "hf-static-batch"):
        from tandem.optimize.bench_hf import load_hf, run_hf_sequential, run_hf_static_batch

        hf = load_hf(probe.path, probe.dtype)
        pad = probe.tokenizer.eos_token_id or 0
        run_hf_sequential(hf, warmup[:2], pad)
        if spec.name == "hf-sequential":
            return (lambda: run_hf_sequential(hf, requests, pad)), (lambda: {"recipe": spec.name})
        return (lambda: run_hf_static_batch(hf, requests, pad, spec.hf_batch_size)), (lambda: {"recipe": spec.name})
    # Every run repeats the warm-up's prompts: a prefix cache would serve the timed runs from the
    # warm-up's keys, and transformers' rows have none. The bench measures computing them.
    config = EngineConfig(
        max_model_len=max_len,
        kv_cache_tokens=max_len * spec.max_num_seqs,
        max_num_seqs=spec.max_num_seqs,
        enable_prefix_caching=False,
    )
    engine = Engine(apply_recipe(probe, spec.name), config)
    run_engine(engine, warmup)
    engine.num_drafted_tokens = engine.num_accepted_tokens = engine.num_spec_rows = 0  # count timed runs only

    def stats() -> dict:
        out: dict = {"recipe": engine.recipe}
        if engine.speculator is not None:
            out["acceptance_rate"] = engine.acceptance_rate
            out["mean_acceptance_length"] = engine.mean_acceptance_length
        return out

    return (lambda: run_engine(engine, requests)), stats


def _worker(conn, spec: RowSpec) -> None:
    try:
        run, stats = _row_runner(spec)
        conn.send(("ready", None))
        while (command := conn.recv()) != "stop":
            conn.send(("timings", run()) if command == "run" else ("stats", stats()))
    except Exception as exc:  # reported to the parent, which names the row
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class _Row:
    def __init__(self, spec: RowSpec, context) -> None:
        self.spec = spec
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker, args=(child, spec), daemon=True)
        self.process.start()
        child.close()

    def ask(self, command: str):
        if command != "ready":
            self.conn.send(command)
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            raise BenchWorkerError(f"bench row {self.spec.name!r}: its process exited") from None
        if kind == "error":
            raise BenchWorkerError(f"bench row {self.spec.name!r}: {payload}")
        return payload

    def close(self) -> None:
        try:
            self.conn.send("stop")
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


def run_rounds(specs: list[RowSpec], repeats: int, progress=None) -> list[tuple[dict, list[Timings]]]:
    """Start each row's process (one at a time, so warm-ups don't overlap), then run `repeats`
    rounds. Returns, per row, its stats (recipe name, acceptance) and its runs' timings.

    `progress(what, done, total)` is told as each of the len(specs) * (1 + repeats) steps begins."""
    context = mp.get_context("spawn")  # a fresh interpreter: no torch thread pools inherited
    rows: list[_Row] = []
    total = len(specs) * (1 + repeats)
    try:
        for spec in specs:
            if progress:
                progress(f"loading and warming up {spec.name}", len(rows), total)
            rows.append(_Row(spec, context))
            rows[-1].ask("ready")
        runs: list[list[Timings]] = [[] for _ in rows]
        for round_ in range(repeats):
            for i, row in enumerate(rows):
                if progress:
                    progress(f"round {round_ + 1}/{repeats}: {row.spec.name}", len(rows) * (1 + round_) + i, total)
                time.sleep(SETTLE_S)
                runs[i].append(row.ask("run"))
        return [(row.ask("stats"), runs[i]) for i, row in enumerate(rows)]
    finally:
        for row in rows:
            row.close()
