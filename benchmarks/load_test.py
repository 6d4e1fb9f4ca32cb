"""Load test: N concurrent streaming clients against a real `tandem serve` on loopback.

Starts the server (or targets --url), runs --clients clients that each send --requests-per-client
streaming completions one after another (fixed output length: ignore_eos), and records every
request's time to first token, time per output token and errors. Bounded in count (clients x
requests) and in time (--deadline). Writes benchmarks/results/load_test.json with the command.

    .venv/bin/python benchmarks/load_test.py                       # bundled model, default recipe
    .venv/bin/python benchmarks/load_test.py --recipe baseline --recipe int8+ngram --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "import os\nimport sys\n\ndef main():",
    "def quicksort(items):",
    "# Read a CSV file and print the sum of the second column\n",
    "def is_prime(n: int) -> bool:",
    "for i in range(10):",
    "def merge(a, b):\n    result = []",
]


@dataclass
class RequestRecord:
    client: int
    ok: bool
    error: str | None
    start: float
    ttft_s: float | None
    e2e_s: float
    output_tokens: int

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


async def one_request(client: httpx.AsyncClient, url: str, body: dict, index: int) -> RequestRecord:
    start = time.perf_counter()
    first: float | None = None
    tokens, done, error = 0, False, None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = f"error event: {chunk['error']['message']}"
                        break
                    if chunk["choices"] and first is None:
                        first = time.perf_counter()
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                if error is None and not done:
                    error = "the stream ended without [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    if error is None and tokens != body["max_tokens"]:
        error = f"expected {body['max_tokens']} tokens, got {tokens}"
    ttft = None if first is None else first - start
    return RequestRecord(index, error is None, error, start, ttft, end - start, tokens)


async def run_clients(url: str, clients: int, per_client: int, max_tokens: int, model: str) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def one_client(index: int) -> None:
            for r in range(per_client):
                body = {
                    "model": model,
                    "prompt": PROMPTS[(index + r) % len(PROMPTS)],
                    "max_tokens": max_tokens,
                    "temperature": 0.8,
                    "seed": index * 1000 + r,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                records.append(await one_request(client, url, body, index))

        await asyncio.gather(*(one_client(i) for i in range(clients)))
    return records


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation): an observed value, never an invented one."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summarize(records: list[RequestRecord], wall_s: float) -> dict:
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpots = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2es = [r.e2e_s for r in ok]
    tokens = sum(r.output_tokens for r in ok)

    def stats(values: list[float]) -> dict:
        return {f"p{q}": percentile(values, q) for q in (50, 90, 99)} | {"mean": sum(values) / len(values)}

    return {
        "requests": len(records),
        "succeeded": len(ok),
        "errors": len(records) - len(ok),
        "error_samples": sorted({r.error for r in records if r.error})[:5],
        "wall_s": wall_s,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall_s,
        "requests_per_s": len(ok) / wall_s,
        "ttft_s": stats(ttfts) if ttfts else None,
        "tpot_s": stats(tpots) if tpots else None,
        "e2e_s": stats(e2es) if e2es else None,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(serve_args: list[str], log_path: Path, timeout_s: float = 300.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "tandem.cli", "serve", *serve_args, "--host", "127.0.0.1", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k != "TANDEM_API_KEY"}
    proc = subprocess.Popen(command, stdout=log_path.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; its log: {log_path}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server was not ready within {timeout_s} s; its log: {log_path}")


def measure(url: str, args: argparse.Namespace) -> dict:
    """One load run against the server at `url`: its model, recipe, summary and every request."""
    served = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
    print(
        f"{args.clients} clients x {args.requests_per_client} streaming requests, {args.max_tokens} tokens "
        f"each, against {served['id']} ({served['recipe']}) at {url}",
        file=sys.stderr,
    )
    started = time.perf_counter()
    records = asyncio.run(
        asyncio.wait_for(
            run_clients(url, args.clients, args.requests_per_client, args.max_tokens, served["id"]),
            timeout=args.deadline,
        )
    )
    summary = summarize(records, time.perf_counter() - started)
    s = summary
    line = f"  {served['recipe']}: {s['requests']} requests, {s['errors']} errors, {s['output_tokens_per_s']:.0f} tok/s"
    if s["ttft_s"] and s["tpot_s"]:
        line += (
            f", TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms p99 {s['ttft_s']['p99'] * 1e3:.0f} ms"
            f", TPOT p50 {s['tpot_s']['p50'] * 1e3:.1f} ms p99 {s['tpot_s']['p99'] * 1e3:.1f} ms"
        )
    print(line, file=sys.stderr)
    return {
        "model": served["id"],
        "model_path": served.get("root"),
        "recipe": served["recipe"],
        "max_model_len": served.get("max_model_len"),
        "summary": summary,
        "requests": [asdict(r) | {"tpot_s": r.tpot_s} for r in records],
    }


def serve_args(args: argparse.Namespace, recipe: str | None) -> list[str]:
    argv = ["--model", args.model] if args.model else []
    argv += ["--recipe", recipe] if recipe else []
    argv += ["--threads", str(args.threads)] if args.threads else []
    # Every client's sequence may hold a KV slot at once (the model's context permitting).
    return [*argv, "--max-num-seqs", str(args.clients)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="target a running server instead of starting one")
    parser.add_argument("--model", help="model directory (default: the bundled model)")
    parser.add_argument(
        "--recipe", action="append", help="recipe; repeat to measure several one after another (default: the server's)"
    )
    parser.add_argument("--threads", type=int, help="the server's torch threads (default: all cores)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--deadline", type=float, default=900.0, help="give up a run after this many seconds")
    parser.add_argument("--out", type=Path, default=RESULTS / "load_test.json")
    args = parser.parse_args()
    if args.clients < 1 or args.requests_per_client < 1:
        parser.error("--clients and --requests-per-client must be at least 1")
    if args.url and args.recipe:
        parser.error("--recipe starts servers; with --url the running server's recipe is measured")

    runs = []
    if args.url:
        runs.append(measure(args.url, args))
    for recipe in args.recipe or ([None] if not args.url else []):
        log_path = Path(tempfile.mkdtemp(prefix="tandem-load-")) / "server.log"
        proc, url = start_server(serve_args(args, recipe), log_path)
        try:
            run = measure(url, args)
        finally:
            proc.send_signal(signal.SIGTERM)
            exit_code = proc.wait(60)
        runs.append(run | {"server_exit_code": exit_code})
    result = {
        "command": shlex.join([".venv/bin/python", *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "server_threads": args.threads,  # None: the engine's default (all cores)
        "env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "MKL_"))},
        "clients": args.clients,
        "requests_per_client": args.requests_per_client,
        "max_tokens": args.max_tokens,
        "sampling": {"temperature": 0.8, "ignore_eos": True, "stream": True},
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"-> {args.out}", file=sys.stderr)
    errors = sum(run["summary"]["errors"] for run in runs)
    if errors:
        samples = [e for run in runs for e in run["summary"]["error_samples"]]
        raise SystemExit(f"{errors} request(s) failed, e.g. {samples[:3]}")


if __name__ == "__main__":
    main()
