"""The Ray backend against the local one on this machine: how long a new replica takes, and what two
replicas serve through the gateway.

1. Scale-up latency: from the controller's decision (Backend.start) to the replica answering its
   readiness probe, for a local process and for a Ray actor's process (and, for Ray, how much of
   that is the actor being placed and its worker started). Rounds alternate which backend goes
   first.
2. Throughput: a gateway over 2 local replicas and one over 2 Ray replicas (both resident; the
   same model, recipe and threads), the same streaming load sent to each in turn, rounds
   alternating. On one machine the replicas are the same processes either way, so any gap is the
   backend's overhead (or noise: see the loads recorded).

A single-node Ray cluster in this process (Ray's own accounting: 4 CPUs); replicas on the bundled
model, one thread each. Writes benchmarks/results/bench_ray.json with the command.

    .venv/bin/python benchmarks/bench_ray.py
    .venv/bin/python benchmarks/bench_ray.py --rounds 5 --clients 16 --requests-per-client 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from load_test import free_port, run_clients, summarize

from tandem.cluster.backend import Backend, ReplicaSpec
from tandem.cluster.local import LocalBackend, popen_spawner
from tandem.cluster.ray import RayBackend
from tandem.cluster.ray.runtime import RayPlacer
from tandem.deployment import parse_deployment
from tandem.edge.settings import settings_variables
from tandem.gateway.app import create_gateway_app
from tandem.gateway.wiring import build_gateway, replica_environment

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODEL_NAME = "bench"
REPLICA_ARGS = ("--served-model-name", MODEL_NAME, "--max-num-seqs", "16")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def backends(log_dir: Path) -> dict[str, Backend]:
    env = replica_environment(os.environ)
    local = LocalBackend(spawn=popen_spawner(log_dir / "local"), base_env=env, kill_after_s=20.0)
    placer = RayPlacer(log_dir=str(log_dir / "ray"), unset_env=settings_variables())
    return {"local": local, "ray": RayBackend(placer, kill_after_s=20.0)}


def wait_gone(backend: Backend, replica_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(e.replica.replica_id == replica_id for e in backend.exits()):
            return
        time.sleep(0.1)
    raise SystemExit(f"replica {replica_id} did not exit within {timeout_s} s")


def time_to_ready(backend: Backend, spec: ReplicaSpec, timeout_s: float = 300.0) -> dict[str, float]:
    """Seconds from start() to the first ready probe (and, on Ray, to the actor's launch report)."""
    started = time.perf_counter()
    replica = backend.start(spec)
    placed: float | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            backend.exits()  # on Ray: learns where the replica was placed
            if placed is None and backend.list()[0].url:  # a local replica has its address at once
                placed = time.perf_counter() - started
            if backend.health(replica.replica_id):
                return {"ready_s": time.perf_counter() - started, "placed_s": placed or 0.0}
            time.sleep(0.05)
        raise SystemExit(f"replica {replica.replica_id} not ready within {timeout_s} s")
    finally:
        backend.stop(replica.replica_id)
        wait_gone(backend, replica.replica_id)


class RunningGateway:
    """The real gateway app under uvicorn in a thread, over `backend`, with a fixed fleet of `replicas`."""

    def __init__(self, backend: Backend, replicas: int, threads: int) -> None:
        raw = {
            "threads": threads,
            "variants": [{"name": "v", "replicas": {"min": replicas, "max": replicas}, "args": list(REPLICA_ARGS)}],
            "policy": {"name": "hpa", "interval_s": 0.5, "params": {"target": 1000}},
        }
        self.gw = build_gateway(parse_deployment(raw), backend, buffer_timeout_s=120.0)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_gateway_app(self.gw), host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.server.install_signal_handlers = lambda: None
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def wait_ready(self, count: int, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sum(1 for r in self.gw.backend.list() if r.state == "ready") >= count:
                return
            time.sleep(0.2)
        raise SystemExit(f"the gateway's {count} replicas were not ready within {timeout_s} s")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)


def throughput(url: str, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    records = asyncio.run(run_clients(url, args.clients, args.requests_per_client, args.max_tokens, MODEL_NAME))
    return summarize(records, time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="Rounds of each measurement (alternating backends).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica.")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_ray.json")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=4, include_dashboard=False, namespace="tandem", log_to_driver=False)
    load_before = loadavg()
    spec = ReplicaSpec("v", None, threads=args.threads, extra_args=REPLICA_ARGS)
    startup: dict[str, list[dict[str, float]]] = {"local": [], "ray": []}
    rates: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="tandem-bench-ray-") as scratch:
        homes = backends(Path(scratch))
        for round_ in range(args.rounds):
            for name in ("local", "ray") if round_ % 2 == 0 else ("ray", "local"):
                startup[name].append(time_to_ready(homes[name], spec))
                print(f"startup round {round_ + 1} {name}: {startup[name][-1]}", file=sys.stderr)

        gateways = {name: RunningGateway(backend, 2, args.threads) for name, backend in backends(Path(scratch)).items()}
        try:
            for gw in gateways.values():
                gw.wait_ready(2)
            for gw in gateways.values():  # warm-up: every replica has served before anything is timed
                throughput(gw.url, argparse.Namespace(**{**vars(args), "requests_per_client": 1}))
            for round_ in range(args.rounds):
                for name in ("local", "ray") if round_ % 2 == 0 else ("ray", "local"):
                    result = throughput(gateways[name].url, args)
                    result["loadavg"] = loadavg()
                    rates[name].append(result)
                    print(
                        f"throughput round {round_ + 1} {name}: {result['output_tokens_per_s']:.0f} tok/s, "
                        f"{result['errors']} errors, load {result['loadavg']}",
                        file=sys.stderr,
                    )
        finally:
            for gw in gateways.values():
                gw.stop()

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    summary = {
        "startup_ready_s": {k: median([r["ready_s"] for r in v]) for k, v in startup.items()},
        "startup_placed_s_ray": median([r["placed_s"] for r in startup["ray"]]),
        "throughput_tok_s": {k: median([r["output_tokens_per_s"] for r in v]) for k, v in rates.items()},
        "errors": {k: sum(r["errors"] for r in v) for k, v in rates.items()},
    }
    # Each round's pair ran back to back: its ratio is less exposed to the machine's load changing.
    pairs = zip(rates["ray"], rates["local"], strict=True)
    per_round = [round(ray_["output_tokens_per_s"] / local["output_tokens_per_s"], 3) for ray_, local in pairs]
    ready_pairs = zip(startup["ray"], startup["local"], strict=True)
    summary["startup_ray_over_local_by_round"] = [round(r["ready_s"] / q["ready_s"], 3) for r, q in ready_pairs]
    summary["startup_ray_over_local"] = median(summary["startup_ray_over_local_by_round"])
    summary["throughput_ray_over_local_by_round"] = per_round
    summary["throughput_ray_over_local"] = median(per_round)
    result = {
        "command": " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/bench_ray.py", *sys.argv[1:]]),
        "ray_version": ray.__version__,
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "setup": {
            "model": "bundled (tandem-code-target), the default recipe",
            "threads": args.threads,
            "clients": args.clients,
            "requests_per_client": args.requests_per_client,
            "max_tokens": args.max_tokens,
            "ray": "single-node cluster in this process (num_cpus=4)",
        },
        "summary": summary,
        "startup": startup,
        "throughput": {k: [{x: r[x] for x in r if x != "records"} for r in v] for k, v in rates.items()},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    ray.shutdown()


if __name__ == "__main__":
    main()
