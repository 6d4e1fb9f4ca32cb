"""What shadow traffic costs the clients: client-facing latency with shadowing on (fraction 0.2)
against off, side by side in one run, against an A/A control that says how large "noise" is.

Three gateways start once each (`tandem serve --deployment FILE`, the CLI as a user runs it), one
replica of the incumbent each (--recipe, 1 thread):
- `off` and `off-again`: the incumbent alone, identical (the A/A pair: any difference between them
  is this machine's noise);
- `on`: the same plus a `gate:` block: --candidate as a variant with one replica, --fraction of live
  requests mirrored to it and scored teacher-forced (the candidate echoes the incumbent's text; the
  incumbent's side is the track its replica kept while generating), the gate's minimum samples set
  high so it keeps shadowing for the whole run.
Rounds rotate the order of the three (this machine is shared and its load drifts), each a closed
loop of --clients streaming clients sending --requests greedy completions; one gateway is under
load at a time. Per round and metric (the load generator's TTFT p50/p90, end-to-end p50 and TPOT
p50, and the gateway's own mean arrival-to-first-byte time) the ratios on/off and off-again/off;
over rounds, the geometric mean of each ratio with a 95% bootstrap interval, and a two-sided
Mann-Whitney U test of on/off against off-again/off (per-round log-ratios). "Within noise" means the
test finds no difference at 5% and the on/off mean lies inside the A/A ratios' range. For `on`,
the mirror's counts and how pairs were scored (GET /admin/gate).

--layout says where the processes run on this machine's CPUs:
- shared (default): everywhere. The candidate's decoding, the gateways, the load generator and the
  incumbents all compete for 2 cores: the worst case, and not how shadowing is deployed.
- split: the gateways and the candidate's replica on the last CPU, the candidate under SCHED_IDLE
  (it only gets CPU time nobody else wants: the accelerator of its own it has in production); the
  incumbents' replicas and the load generator on the others. Every configuration gets the same
  CPUs, and the load generator never shares the gateway's (in production clients do not; when
  it did here, the gateway's mirroring work delayed the load generator's own timestamps and
  showed as +30% on its TTFT p90, while the gateway's own first-byte times did not move).
Writes benchmarks/results/shadow_latency.json.

    python benchmarks/bench_shadow.py [--layout shared|split] [--rounds 8] [--requests 80] [--name NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import scipy.stats
import yaml
from common import load_average, record
from load_test import PROMPTS, free_port, one_request, summarize

from tandem.schedule.engine_loads import metric_samples

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


def start_gateway(name: str, config: dict, work: Path, cpus: set[int] | None = None) -> tuple[subprocess.Popen, str]:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    command = [sys.executable, "-m", "tandem.cli", "serve", "--deployment", str(path), "--port", str(port),
               "--log-dir", str(work / f"{name}-logs")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    log = work / f"{name}.log"
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))  # its replicas inherit it
    proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, preexec_fn=pin)
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


NAMES = ("off", "off-again", "on")
METRICS = (("ttft_p50", "ttft_s", "p50"), ("ttft_p90", "ttft_s", "p90"), ("e2e_p50", "e2e_s", "p50"),
           ("tpot_p50", "tpot_s", "p50"), ("gateway_ttfb_mean", "gateway_ttfb_s", "mean"))  # fmt: skip


def gateway_first_byte(url: str) -> tuple[float, float]:
    """(sum, count) of the gateway's own arrival-to-first-byte histogram, over its variants."""
    samples = metric_samples(httpx.get(url + "/metrics", timeout=30).text)
    name = "tandem:gateway_time_to_first_byte_seconds"
    return sum(samples.get(name + "_sum", [0.0])), sum(samples.get(name + "_count", [0.0]))


def run_once(name: str, url: str, args: argparse.Namespace, round_index: int) -> dict:
    before = gateway_first_byte(url)
    started = time.perf_counter()
    records = asyncio.run(closed_loop(url, args, round_index))
    summary = summarize(records, time.perf_counter() - started)
    after = gateway_first_byte(url)
    # The gateway's view of the client-facing TTFT (arrival to first byte): no load generator's timing in it.
    summary["gateway_ttfb_s"] = {"mean": (after[0] - before[0]) / max(after[1] - before[1], 1)}
    if name == "on":
        view = httpx.get(url + "/admin/gate", timeout=30).json()
        summary["mirror"], summary["scoring"] = view["mirror"], view["scoring"]
    s = summary
    print(
        f"  {name}: {s['succeeded']}/{s['requests']} ok, TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms, "
        f"e2e p50 {s['e2e_s']['p50'] * 1e3:.0f} ms",
        file=sys.stderr,
    )
    return summary


def place(pattern: str, cpus: set[int], idle: bool = False) -> list[int]:
    """Every thread of the processes whose command line contains `pattern` (a variant's replicas) on
    `cpus` and, if `idle`, under SCHED_IDLE: it runs only when nothing else wants the CPU and yields
    at once when something wakes (nice 19 does not: a woken thread may wait out its slice). Linux
    keeps both per thread; threads made later inherit them."""
    tids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not (proc.name.isdigit() and pattern.encode() in b" ".join(argv)):
                continue
            for task in (proc / "task").iterdir():
                os.sched_setaffinity(int(task.name), cpus)
                if idle:
                    os.sched_setscheduler(int(task.name), os.SCHED_IDLE, os.sched_param(0))
                tids.append(int(task.name))
        except OSError:
            continue
    return tids


def compare(log_on: list[float], log_aa: list[float], seed: int = 0) -> dict:
    """On/off against off-again/off, from per-round log-ratios: means, 95% bootstrap intervals, U test."""
    rng = np.random.default_rng(seed)

    def interval(values: list[float]) -> list[float]:
        x = np.asarray(values)
        means = rng.choice(x, size=(10_000, len(x))).mean(axis=1)
        return [float(np.exp(np.quantile(means, 0.025))), float(np.exp(np.quantile(means, 0.975)))]

    p = float(scipy.stats.mannwhitneyu(log_on, log_aa, alternative="two-sided").pvalue)
    on_mean, aa = float(np.exp(np.mean(log_on))), [float(np.exp(v)) for v in log_aa]
    return {
        "on_over_off": on_mean, "on_over_off_ci95": interval(log_on),
        "aa_over_off": float(np.exp(np.mean(log_aa))), "aa_over_off_ci95": interval(log_aa),
        "aa_range": [min(aa), max(aa)], "mann_whitney_p": p,
        "within_noise": p >= 0.05 and min(aa) <= on_mean <= max(aa),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=80, help="requests per round and configuration")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop streaming clients")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--fraction", type=float, default=0.2, help="share of requests mirrored when on")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--recipe", default="baseline", help="the incumbent")
    parser.add_argument("--candidate", default="int8+ngram")
    parser.add_argument(
        "--layout", choices=("shared", "split"), default="shared",
        help="shared: every process on every CPU; split: the gateways and the candidate (SCHED_IDLE) on the "
        "last CPU, the incumbents and the load generator on the others",
    )  # fmt: skip
    parser.add_argument("--name", default="shadow_latency", help="results/NAME.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tandem-shadow-bench-"))
    cpus = sorted(os.sched_getaffinity(0))
    front = back = None  # split: the gateways' and the candidate's CPU; the incumbents' and load generator's
    if args.layout == "split":
        if len(cpus) < 2:
            raise SystemExit("--layout split needs 2 CPUs")
        front, back = {cpus[-1]}, set(cpus[:-1])
    gateways = {name: start_gateway(name, deployment(name == "on", args), work, front) for name in NAMES}
    try:
        for name, (proc, url) in gateways.items():
            wait_ready(proc, url, 2 if name == "on" else 1, work / f"{name}.log")
        if front is not None and back is not None:
            os.sched_setaffinity(0, back)
            incumbents = place("--replica-variant incumbent", back)
            candidate = place("--replica-variant candidate", front, idle=True)
            print(
                f"the gateways and the candidate (threads {candidate}, SCHED_IDLE) on CPUs {sorted(front)}; "
                f"the incumbents (threads {incumbents}) and the load generator on {sorted(back)}",
                file=sys.stderr,
            )
        for _, url in gateways.values():  # one-time costs outside the measurement
            asyncio.run(closed_loop(url, argparse.Namespace(**{**vars(args), "requests": args.clients}), -1))
        runs: dict[str, list[dict]] = {name: [] for name in NAMES}
        loads = [load_average()]
        for round_index in range(args.rounds):
            print(f"round {round_index + 1}/{args.rounds} (load {loads[-1]})", file=sys.stderr)
            shift = round_index % len(NAMES)
            for name in NAMES[shift:] + NAMES[:shift]:
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
    per_round, verdicts = {}, {}
    for key, metric, q in METRICS:
        value = {name: [s[metric][q] for s in runs[name]] for name in NAMES}
        log_on = [math.log(a / b) for a, b in zip(value["on"], value["off"], strict=True)]
        log_aa = [math.log(a / b) for a, b in zip(value["off-again"], value["off"], strict=True)]
        per_round[key] = {"on_over_off": [round(math.exp(v), 3) for v in log_on],
                          "aa_over_off": [round(math.exp(v), 3) for v in log_aa]}  # fmt: skip
        verdicts[key] = compare(log_on, log_aa)
        v = verdicts[key]
        print(
            f"{key}: on/off {v['on_over_off']:.3f}x "
            f"(95% CI {v['on_over_off_ci95'][0]:.3f}-{v['on_over_off_ci95'][1]:.3f}), "
            f"A/A {v['aa_over_off']:.3f}x (range {v['aa_range'][0]:.3f}-{v['aa_range'][1]:.3f}), "
            f"U test p={v['mann_whitney_p']:.2f}: {'within noise' if v['within_noise'] else 'NOT within noise'}"
        )
    last = runs["on"][-1]
    print(f"mirror: {last['mirror']}\nscoring: {last['scoring']}")
    path = record(
        args.name,
        {
            "workload": {
                "requests_per_round": args.requests, "clients": args.clients, "max_tokens": args.max_tokens,
                "rounds": args.rounds, "fraction": args.fraction, "incumbent": args.recipe,
                "candidate": args.candidate, "threads_per_replica": args.threads, "stream": True, "temperature": 0,
                "layout": args.layout,
            },
            "load_average": loads,
            "verdicts": verdicts,
            "per_round": per_round,
            "mirror": last["mirror"],
            "scoring": last["scoring"],
            "runs": runs,
        },
    )  # fmt: skip
    print(f"recorded {path}")


if __name__ == "__main__":
    main()
