"""What shadow traffic costs the clients: client-facing TTFT and latency with shadowing on (fraction 0.2)
against off, side by side in one run.

Two gateways start once each (`tandem serve --deployment FILE`, the CLI as a user runs it), one
replica of the incumbent each (--recipe, 1 thread):
- `off`: the incumbent alone;
- `on`: the same plus a `gate:` block: --candidate as a variant with one replica, --fraction of live
  requests mirrored to it and scored teacher-forced (echo on both sides), the gate's minimum samples
  set high so it keeps shadowing for the whole run.
Rounds interleave the two (this machine is shared and its load drifts; the order flips each round),
each a closed loop of --clients streaming clients sending --requests greedy completions; only one
gateway is under load at a time. Reported per configuration: the median over rounds of TTFT and
end-to-end p50/p90, and the on/off ratios; for `on` also the mirror's counts from GET /admin/gate.
Writes benchmarks/results/shadow_latency.json.

    python benchmarks/bench_shadow.py [--rounds 4] [--requests 80] [--clients 4] [--fraction 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from common import load_average, record
from load_test import PROMPTS, free_port, one_request, summarize

PROFILE = {  # inline Profiles: the gate's cost inputs (this benchmark is about latency, not cost)
    "hardware": "cpu", "model": "bundled", "weight_bytes": 1, "kv_bytes_per_token": 1, "max_slots": 8,
    "decode_tokens_per_s": {"1": 50.0, "8": 200.0}, "prefill_tokens_per_s": 1000.0, "ttft_s_p50": 0.05,
    "cold_start_s": 3.0,
}  # fmt: skip


def deployment(shadow: bool, args: argparse.Namespace) -> dict:
    replica_args = ["--served-model-name", "bench", "--max-num-seqs", "8"]
    variants = [{"name": "incumbent", "recipe": args.recipe, "replicas": {"min": 1, "max": 1}, "args": replica_args,
                 "profile": {"recipe": args.recipe, **PROFILE}}]  # fmt: skip
    config = {"threads": args.threads, "policy": {"name": "hpa"}, "variants": variants}
    if shadow:
        variants.append({"name": "candidate", "recipe": args.candidate, "replicas": {"min": 1, "max": 1},
                         "args": replica_args, "profile": {"recipe": args.candidate, **PROFILE}})  # fmt: skip
        config["gate"] = {
            "candidate": "candidate", "fraction": args.fraction, "deadline_s": None, "max_samples": 100_000,
            "min_samples": {"latency": 50_000, "accuracy": 50_000, "errors": 50_000},  # never decides here
        }  # fmt: skip
    return config


def start_gateway(name: str, config: dict, work: Path) -> tuple[subprocess.Popen, str]:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    command = [sys.executable, "-m", "tandem.cli", "serve", "--deployment", str(path), "--port", str(port),
               "--log-dir", str(work / f"{name}-logs")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    log = work / f"{name}.log"
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, url: str, replicas: int, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited with {proc.returncode}; its log: {log}")
        try:
            view = httpx.get(url + "/admin/replicas", timeout=5).json()
            if sum(r["state"] == "ready" for r in view["replicas"]) >= replicas:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"the gateway's replicas were not ready within 300 s; log: {log}")


async def closed_loop(url: str, args: argparse.Namespace, round_index: int) -> list:
    queue = list(range(args.requests))
    records = []
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def worker(index: int) -> None:
            while queue:
                i = queue.pop(0)
                body = {
                    "model": "bench", "prompt": PROMPTS[(i + round_index) % len(PROMPTS)],
                    "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True},
                }  # fmt: skip
                records.append(await one_request(client, url, body, index))

        await asyncio.gather(*(worker(i) for i in range(args.clients)))
    return records


def run_once(name: str, url: str, args: argparse.Namespace, round_index: int) -> dict:
    started = time.perf_counter()
    records = asyncio.run(closed_loop(url, args, round_index))
    summary = summarize(records, time.perf_counter() - started)
    if name == "on":
        summary["mirror"] = httpx.get(url + "/admin/gate", timeout=30).json()["mirror"]
    s = summary
    print(
        f"  {name}: {s['succeeded']}/{s['requests']} ok, TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms, "
        f"e2e p50 {s['e2e_s']['p50'] * 1e3:.0f} ms",
        file=sys.stderr,
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=80, help="requests per round and configuration")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop streaming clients")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--fraction", type=float, default=0.2, help="share of requests mirrored when on")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--recipe", default="baseline", help="the incumbent")
    parser.add_argument("--candidate", default="int8+ngram")
    parser.add_argument("--name", default="shadow_latency", help="results/NAME.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tandem-shadow-bench-"))
    gateways = {name: start_gateway(name, deployment(name == "on", args), work) for name in ("off", "on")}
    try:
        for name, (proc, url) in gateways.items():
            wait_ready(proc, url, 2 if name == "on" else 1, work / f"{name}.log")
        for _, url in gateways.values():  # one-time costs outside the measurement
            asyncio.run(closed_loop(url, argparse.Namespace(**{**vars(args), "requests": args.clients}), -1))
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        loads = [load_average()]
        for round_index in range(args.rounds):
            print(f"round {round_index + 1}/{args.rounds} (load {loads[-1]})", file=sys.stderr)
            for name in ("off", "on") if round_index % 2 == 0 else ("on", "off"):
                runs[name].append(run_once(name, gateways[name][1], args, round_index))
                loads.append(load_average())
    finally:
        for proc, _ in gateways.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in gateways.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    results = {}
    for name, summaries in runs.items():
        results[name] = {
            f"{metric}_{q}_s": statistics.median(s[f"{metric}_s"][q] for s in summaries)
            for metric in ("ttft", "e2e")
            for q in ("p50", "p90")
        } | {"errors": sum(s["errors"] for s in summaries), "runs": summaries}
    ratios = {key: results["on"][key] / results["off"][key] for key in results["off"] if key.endswith("_s")}
    per_round = {
        key: [on[m][q] / off[m][q] for on, off in zip(runs["on"], runs["off"], strict=True)]
        for key, m, q in (("ttft_p50", "ttft_s", "p50"), ("e2e_p50", "e2e_s", "p50"))
    }
    for key, value in ratios.items():
        print(f"on/off {key}: {value:.3f}x (per round: {[round(x, 3) for x in per_round.get(key[:-2], [])]})")
    path = record(
        args.name,
        {
            "workload": {
                "requests_per_round": args.requests, "clients": args.clients, "max_tokens": args.max_tokens,
                "rounds": args.rounds, "fraction": args.fraction, "incumbent": args.recipe,
                "candidate": args.candidate, "threads_per_replica": args.threads, "stream": True, "temperature": 0,
            },
            "load_average": loads,
            "on_over_off": ratios,
            "on_over_off_per_round": per_round,
            "results": results,
        },
    )  # fmt: skip
    print(f"recorded {path}")


if __name__ == "__main__":
    main()
