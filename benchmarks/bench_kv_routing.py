"""KV-aware routing against prefix-affinity and least-outstanding on real replicas: 2 replicas behind
the gateway, a shared-prefix chat-like workload.

Each run starts `tandem serve --deployment FILE` (the CLI, as a user would) with two replicas of one
variant, cold, and replays the same conversations: --system-prompts long system prompts (windows of
held-out code the bundled model never trained on), --conversations users each talking to one of
them for --turns turns. A turn's prompt is the conversation so far (system prompt, earlier
questions and answers) plus a new question, so it grows, and all but its newest part was the
previous turn's prompt: what a replica's block cache can reuse, if the router sends the turn where
the previous one went. --clients closed-loop clients each take a conversation and play its turns in
order. (The earlier answers in the history are canned text, not the model's output: what is
reused is the previous prompt, which is what the block cache holds.) Routers:

- `kv-aware`: the replicas' KV events tell the gateway which blocks each holds; it weighs the
  prefill saved against each replica's queue;
- `prefix-affinity`: a hash of the prompt's first 256 characters (the system prompt) picks the replica;
- `least-outstanding`: the replica with fewer requests in flight, prefixes ignored.

Rounds interleave the routers (this machine is shared; its load drifts); each router reports its
median over rounds of TTFT p50 and p99 and output tokens/s, and the prefix hit rate: prompt tokens
the replicas served from their cache / prompt tokens, from each answer's
`usage.prompt_tokens_details.cached_tokens`. Writes benchmarks/results/kv_routing.json.

    python benchmarks/bench_kv_routing.py [--rounds 1] [--conversations 24] [--turns 4] [--clients 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bench_prefix_affinity import start_gateway, system_prompts
from common import load_average, record
from load_test import RequestRecord, summarize

ROUTERS = ("kv-aware", "prefix-affinity", "least-outstanding")
QUESTIONS = ["What does the function above return?", "List its inputs.", "Is there a bug?", "Write a test for it.",
             "Summarize it in one line.", "Which names could be clearer?", "What raises an error?"]  # fmt: skip
ANSWER = "It reads its inputs, checks them, and returns the result the caller asked for."


def conversations(system: list[str], count: int, turns: int, seed: int) -> list[list[str]]:
    """`count` conversations of `turns` growing prompts each."""
    rng = random.Random(seed)
    out = []
    for c in range(count):
        history = rng.choice(system)
        prompts = []
        for t in range(turns):
            history += f"\n# User {c}, turn {t}: {rng.choice(QUESTIONS)}\n"
            prompts.append(history)
            history += f"# Assistant: {ANSWER}\n"
        out.append(prompts)
    return out


def deployment(router: str, args: argparse.Namespace) -> dict:
    replica_args = ["--max-num-seqs", str(args.max_num_seqs), "--served-model-name", "bench"]
    if args.kv_cache_tokens:
        replica_args += ["--kv-cache-tokens", str(args.kv_cache_tokens)]
    variant = {"name": "main", "recipe": args.recipe, "replicas": {"min": 2, "max": 2}, "args": replica_args}
    return {"threads": args.threads, "policy": {"name": "hpa"}, "router": {"name": router}, "variants": [variant]}


async def one_turn(client: httpx.AsyncClient, url: str, body: dict, index: int, usage: list) -> RequestRecord:
    """One streamed completion; its usage (prompt tokens, cached prompt tokens) appended to `usage`."""
    start, first, tokens, error = time.perf_counter(), None, 0, None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        error = f"error event: {chunk['error']['message']}"
                        break
                    if chunk["choices"] and first is None:
                        first = time.perf_counter()
                    if chunk.get("usage"):
                        use = chunk["usage"]
                        tokens = use["completion_tokens"]
                        cached = (use.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                        usage.append((use["prompt_tokens"], cached))
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    if error is None and tokens != body["max_tokens"]:
        error = f"expected {body['max_tokens']} tokens, got {tokens}"
    return RequestRecord(
        index, error is None, error, start, None if first is None else first - start, end - start, tokens
    )


async def closed_loop(url: str, convs: list[list[str]], clients: int, max_tokens: int, usage: list) -> list:
    queue = list(convs)
    records = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def worker(index: int) -> None:
            while queue:
                for prompt in queue.pop(0):  # a conversation's turns, in order
                    body = {
                        "model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                    }  # fmt: skip
                    records.append(await one_turn(client, url, body, index, usage))

        await asyncio.gather(*(worker(i) for i in range(clients)))
    return records


def run_once(router: str, args: argparse.Namespace, convs: list[list[str]]) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tandem-kv-bench-"))
    proc, url = start_gateway(deployment(router, args), work)
    usage: list[tuple[int, int]] = []
    try:
        started = time.perf_counter()
        records = asyncio.run(closed_loop(url, convs, args.clients, args.max_tokens, usage))
        summary = summarize(records, time.perf_counter() - started)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    prompt, cached = sum(p for p, _ in usage), sum(c for _, c in usage)
    summary["prefix_cache_hit_rate"] = cached / prompt if prompt else None
    summary["prompt_tokens"], summary["cached_prompt_tokens"] = prompt, cached
    s = summary
    rate = "n/a" if s["prefix_cache_hit_rate"] is None else f"{s['prefix_cache_hit_rate']:.0%}"
    print(
        f"  {router}: {s['succeeded']}/{s['requests']} ok, TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms, "
        f"p99 {s['ttft_s']['p99'] * 1e3:.0f} ms, {s['output_tokens_per_s']:.0f} tok/s, prefix hit rate {rate}",
        file=sys.stderr,
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--system-prompts", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=200)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--clients", type=int, default=6, help="closed-loop clients (conversations at once)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--kv-cache-tokens", type=int, default=0, help="the replicas' KV budget (0: their default)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--recipe", default="baseline")
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--name", default="kv_routing", help="results/NAME.json")
    args = parser.parse_args()
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    if unknown := [r for r in routers if r not in ROUTERS]:
        parser.error(f"unknown router(s) {unknown}; known: {', '.join(ROUTERS)}")
    convs = conversations(system_prompts(args.system_prompts, args.system_tokens), args.conversations, args.turns, 0)
    runs: dict[str, list[dict]] = {r: [] for r in routers}
    loads = [load_average()]
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds} (load {loads[-1]})", file=sys.stderr)
        for router in routers if round_index % 2 == 0 else routers[::-1]:
            runs[router].append(run_once(router, args, convs))
            loads.append(load_average())
    results = {}
    for router, summaries in runs.items():
        rates = [s["prefix_cache_hit_rate"] for s in summaries if s["prefix_cache_hit_rate"] is not None]
        results[router] = {
            "ttft_p50_s": statistics.median(s["ttft_s"]["p50"] for s in summaries),
            "ttft_p99_s": statistics.median(s["ttft_s"]["p99"] for s in summaries),
            "output_tokens_per_s": statistics.median(s["output_tokens_per_s"] for s in summaries),
            "prefix_cache_hit_rate": statistics.median(rates) if rates else None,
            "errors": sum(s["errors"] for s in summaries),
            "runs": summaries,
        }
        r = results[router]
        rate = "n/a" if r["prefix_cache_hit_rate"] is None else f"{r['prefix_cache_hit_rate']:.0%}"
        print(
            f"{router}: TTFT p50 {r['ttft_p50_s'] * 1e3:.0f} ms, p99 {r['ttft_p99_s'] * 1e3:.0f} ms, "
            f"{r['output_tokens_per_s']:.0f} output tok/s, prefix hit rate {rate}"
        )
    path = record(
        args.name,
        {
            "workload": {
                "system_prompts": args.system_prompts, "system_tokens": args.system_tokens,
                "conversations": args.conversations, "turns": args.turns, "clients": args.clients,
                "max_tokens": args.max_tokens, "replicas": 2, "max_num_seqs": args.max_num_seqs,
                "kv_cache_tokens": args.kv_cache_tokens, "threads_per_replica": args.threads, "recipe": args.recipe,
            },
            "load_average": loads,
            "results": results,
        },
    )  # fmt: skip
    print(f"recorded {path}")


if __name__ == "__main__":
    main()
