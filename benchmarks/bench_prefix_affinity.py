"""Prefix-affinity routing pays once replicas cache prefixes: 2 replicas behind the gateway, 8 system prompts.

Each run starts `tandem serve --deployment FILE` (the CLI, as a user would) with two replicas of one
variant, cold, and sends --requests streaming completions from --clients closed-loop clients. Every
prompt is one of 8 distinct ~400-token system prompts (held-out code the bundled model never trained
on) followed by a short request of its own. Configurations:

- `prefix-affinity`: the router sends a system prompt to the same replica, whose prefix cache then
  holds it; each replica sees about half the prompts;
- `least-outstanding`: any replica serves any prompt, so each replica's cache must hold all 8;
- `prefix-affinity (no cache)` (control): the same routing with `--no-enable-prefix-caching`.

Rounds interleave the configurations (this machine is shared; its load drifts), and each
configuration reports its median over rounds of TTFT p50 and output throughput, with the replicas'
prefix-cache hit rates read from their /metrics. Writes benchmarks/results/prefix_affinity.json.

    python benchmarks/bench_prefix_affinity.py [--rounds 3] [--requests 192] [--clients 8] [--max-num-seqs 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
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
from load_test import free_port, one_request, summarize

CONFIGS = {
    "prefix-affinity": ("prefix-affinity", True),
    "least-outstanding": ("least-outstanding", True),
    "prefix-affinity (no cache)": ("prefix-affinity", False),
}


def system_prompts(count: int, tokens: int) -> list[str]:
    """`count` system prompts of about `tokens` tokens: windows of different held-out files."""
    from tandem.model import Tokenizer, default_model_dir
    from tandem.workload import heldout_texts

    tokenizer = Tokenizer(default_model_dir())
    prompts = []
    for text in heldout_texts():
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= tokens:
            prompts.append(
                "# You are a careful Python reviewer. Reference code follows.\n" + tokenizer.decode(ids[:tokens])
            )
        if len(prompts) == count:
            return prompts
    raise SystemExit(f"need {count} held-out files of {tokens} tokens, found {len(prompts)}")


def requests(prompts: list[str], count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    tasks = ["Explain the function above.", "List its inputs.", "Find a bug.", "Write a test.", "Summarize."]
    return [f"{rng.choice(prompts)}\n# Request {i}: {rng.choice(tasks)}\n" for i in range(count)]


def deployment(router: str, caching: bool, args: argparse.Namespace) -> dict:
    replica_args = ["--max-num-seqs", str(args.max_num_seqs), "--kv-cache-tokens", str(args.max_num_seqs * 512)]
    replica_args += ["--served-model-name", "bench"] + ([] if caching else ["--no-enable-prefix-caching"])
    variant = {"name": "main", "recipe": args.recipe, "replicas": {"min": 2, "max": 2}, "args": replica_args}
    return {"threads": args.threads, "policy": {"name": "hpa"}, "router": {"name": router}, "variants": [variant]}


def replica_urls(gateway_pid: int) -> list[str]:
    """The gateway's replicas' addresses, read from their command lines (children of the gateway)."""
    urls = []
    for task in Path(f"/proc/{gateway_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"--port" in argv:
                urls.append(f"http://127.0.0.1:{argv[argv.index(b'--port') + 1].decode()}")
    return urls


def prefix_counters(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        for name in ("tandem:prefix_cache_queries_total", "tandem:prefix_cache_hits_total"):
            if line.startswith(name + "{"):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values.get("tandem:prefix_cache_queries_total", 0.0), values.get("tandem:prefix_cache_hits_total", 0.0)


def start_gateway(config: dict, work: Path) -> tuple[subprocess.Popen, str]:
    path = work / "deployment.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    command = [sys.executable, "-m", "tandem.cli", "serve", "--deployment", str(path), "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    proc = subprocess.Popen(command, stdout=(work / "gateway.log").open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited with {proc.returncode}; its log: {work / 'gateway.log'}")
        try:
            replicas = replica_urls(proc.pid)
            if len(replicas) == 2 and all(httpx.get(u + "/ready", timeout=2).status_code == 200 for u in replicas):
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    return proc, url
        except (httpx.TransportError, OSError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the gateway's two replicas were not ready within 300 s; log: {work / 'gateway.log'}")


async def closed_loop(url: str, prompts: list[str], clients: int, max_tokens: int) -> list:
    queue = list(enumerate(prompts))
    records = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def worker(index: int) -> None:
            while queue:
                _, prompt = queue.pop(0)
                body = {
                    "model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                }  # fmt: skip
                records.append(await one_request(client, url, body, index))

        await asyncio.gather(*(worker(i) for i in range(clients)))
    return records


def run_once(name: str, args: argparse.Namespace, prompts: list[str]) -> dict:
    router, caching = CONFIGS[name]
    work = Path(tempfile.mkdtemp(prefix="tandem-prefix-bench-"))
    proc, url = start_gateway(deployment(router, caching, args), work)
    try:
        replicas = replica_urls(proc.pid)
        started = time.perf_counter()
        records = asyncio.run(closed_loop(url, prompts, args.clients, args.max_tokens))
        summary = summarize(records, time.perf_counter() - started)
        counters = [prefix_counters(u) for u in replicas]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    queries, hits = sum(q for q, _ in counters), sum(h for _, h in counters)
    summary["prefix_cache_hit_rate"] = hits / queries if queries else 0.0
    summary["replica_hit_rates"] = [h / q if q else 0.0 for q, h in counters]
    summary["replica_prompt_tokens"] = [q for q, _ in counters]  # how the router split the load
    s = summary
    print(
        f"  {name}: {s['succeeded']}/{s['requests']} ok, TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms, "
        f"{s['output_tokens_per_s']:.0f} tok/s, prefix-cache hit rate {s['prefix_cache_hit_rate']:.0%}",
        file=sys.stderr,
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=192, help="requests per run")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients (concurrent requests)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--system-tokens", type=int, default=400)
    parser.add_argument("--max-num-seqs", type=int, default=8, help="KV slots per replica (the cache lives in them)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--recipe", default="int8+kv-bf16+ngram")
    parser.add_argument("--configs", default=";".join(CONFIGS), help="';'-separated subset of: " + "; ".join(CONFIGS))
    parser.add_argument("--name", default="prefix_affinity", help="results/NAME.json")
    args = parser.parse_args()
    names = [n.strip() for n in args.configs.split(";") if n.strip()]
    if unknown := [n for n in names if n not in CONFIGS]:
        parser.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    system = system_prompts(8, args.system_tokens)
    prompts = requests(system, args.requests, seed=0)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    loads = [load_average()]
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds} (load {loads[-1]})", file=sys.stderr)
        for name in names if round_index % 2 == 0 else names[::-1]:
            runs[name].append(run_once(name, args, prompts))
            loads.append(load_average())
    results = {}
    for name, summaries in runs.items():
        results[name] = {
            "ttft_p50_s": statistics.median(s["ttft_s"]["p50"] for s in summaries),
            "ttft_p90_s": statistics.median(s["ttft_s"]["p90"] for s in summaries),
            "output_tokens_per_s": statistics.median(s["output_tokens_per_s"] for s in summaries),
            "prefix_cache_hit_rate": statistics.median(s["prefix_cache_hit_rate"] for s in summaries),
            "errors": sum(s["errors"] for s in summaries),
            "runs": summaries,
        }
        r = results[name]
        print(
            f"{name}: TTFT p50 {r['ttft_p50_s'] * 1e3:.0f} ms, p90 {r['ttft_p90_s'] * 1e3:.0f} ms, "
            f"{r['output_tokens_per_s']:.0f} output tok/s, hit rate {r['prefix_cache_hit_rate']:.0%}"
        )
    path = record(
        args.name,
        {
            "workload": {
                "system_prompts": 8, "system_tokens": args.system_tokens, "requests": args.requests,
                "clients": args.clients, "max_tokens": args.max_tokens, "replicas": 2,
                "max_num_seqs": args.max_num_seqs, "threads_per_replica": args.threads, "recipe": args.recipe,
            },
            "load_average": loads,
            "results": results,
        },
    )  # fmt: skip
    print(f"recorded {path}")


if __name__ == "__main__":
    main()
