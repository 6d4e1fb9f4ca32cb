"""Fair sharing under a flood: tenant A sends 64 long requests at once, tenant B interactive ones.

Each configuration starts `tandem serve --deployment FILE` (the CLI, as a user would) with one
replica of the bundled model (`--max-num-seqs 8`), then measures B's time to first token:

1. unloaded: B alone, `--b-requests` streams of 16 tokens, one every `--b-every-s` (open loop);
2. loaded: A starts 64 concurrent streams of `--a-tokens` tokens (ignore_eos), and once they are
   in, B sends the same streams; A's requests must all complete (no starvation).

Configurations:
- `fcfs`: `--api-key` only (one anonymous tenant): the gateway forwards everything and the
  replica admits in arrival order, so B waits behind A's 64;
- `fair`: a tenants file, A `batch`, B `interactive`, `fairness: {max_inflight_per_replica: 8,
  reserved_per_replica: 1}`: the gateway holds A's surplus in its fair queue (priority, then VTC)
  and keeps one slot per replica for the top class.

Reports per configuration B's TTFT p50 unloaded and loaded, their ratio, A's completions and the
time A's flood took. Writes benchmarks/results/fairness.json.

    python benchmarks/bench_fairness.py [--rounds 1] [--a-requests 64] [--a-tokens 128] [--b-requests 12]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
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
from host import cpu_model
from load_test import free_port

RESULTS = Path(__file__).parent / "results"
KEY_A, KEY_B, KEY_ANY = "tdm-bench-a-0123456789abcdef", "tdm-bench-b-0123456789abcdef", "tdm-bench-0123456789"


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def start(workdir: Path, config: str, slots: int, reserved: int) -> tuple[subprocess.Popen, str]:
    deployment = {
        "variants": [
            {"name": "base", "recipe": "baseline", "replicas": {"min": 1, "max": 1},
             "args": ["--max-num-seqs", str(slots), "--max-queue", "256"]},
        ],
        "policy": {"name": "hpa"},
    }  # fmt: skip
    (workdir / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    args = ["--deployment", str(workdir / "deployment.yaml"), "--usage-db", str(workdir / f"usage-{config}.db")]
    # Waiting is what is measured: no request may be cut by the gateway's deadlines (504s would hide the queue).
    args += ["--first-byte-timeout", "1800", "--stream-idle-timeout", "1800", "--queue-timeout", "1800"]
    if config == "fair":
        tenants = {
            "tenants": [
                {"name": "flooder", "keys": [sha(KEY_A)], "priority": "batch"},
                {"name": "interactive", "keys": [sha(KEY_B)], "priority": "interactive"},
            ],
            "fairness": {"max_inflight_per_replica": slots, "reserved_per_replica": reserved},
        }
        (workdir / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        args += ["--tenants", str(workdir / "tenants.yaml")]
    else:
        args += ["--api-key", KEY_ANY]
    port = free_port()
    command = [sys.executable, "-m", "tandem.cli", "serve", *args, "--host", "127.0.0.1", "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_") or k == "TANDEM_CACHE"}
    log = (workdir / f"gateway-{config}.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the gateway exited with {proc.returncode}; see {workdir}/gateway-{config}.log")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the gateway was not ready in 300 s")


async def stream(client: httpx.AsyncClient, url: str, key: str, model: str, tokens: int) -> tuple[float | None, bool]:
    """One streaming completion: (TTFT in s, whether all `tokens` came)."""
    body = {"model": model, "prompt": "def fibonacci(n):", "max_tokens": tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    started, first, got = time.perf_counter(), None, 0
    async with client.stream(
        "POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        if r.status_code != 200:
            return None, False
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.perf_counter() - started
            if chunk.get("usage"):
                got = chunk["usage"]["completion_tokens"]
    return first, got == tokens


async def interactive(client, url, key, model, n: int, every_s: float) -> list[float | None]:
    """B's TTFTs (None: that request failed): `n` requests, one every `every_s` (open loop, as users type)."""

    async def one(delay: float) -> float | None:
        await asyncio.sleep(delay)
        ttft, ok = await stream(client, url, key, model, 16)
        return ttft if ok else None

    return list(await asyncio.gather(*(one(i * every_s) for i in range(n))))


async def run(url: str, config: str, args: argparse.Namespace) -> dict:
    key_a, key_b = (KEY_A, KEY_B) if config == "fair" else (KEY_ANY, KEY_ANY)
    limits = httpx.Limits(max_connections=args.a_requests + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
        models = await client.get(url + "/v1/models", headers={"Authorization": f"Bearer {key_b}"})
        model = models.json()["data"][0]["id"]
        await interactive(client, url, key_b, model, 2, args.b_every_s)  # warm-up
        unloaded = await interactive(client, url, key_b, model, args.b_requests, args.b_every_s)
        flood_started = time.perf_counter()
        flood = [asyncio.create_task(stream(client, url, key_a, model, args.a_tokens)) for _ in range(args.a_requests)]
        await asyncio.sleep(1.0)  # A's requests are in (at the replica, or queued at the gateway)
        loaded = await interactive(client, url, key_b, model, args.b_requests, args.b_every_s)
        b_done = time.perf_counter() - flood_started
        results = await asyncio.gather(*flood)
        flood_s = time.perf_counter() - flood_started
    failed = sum(1 for x in unloaded + loaded if x is None)
    unloaded = [x for x in unloaded if x is not None]
    loaded = [x for x in loaded if x is not None]
    p50_unloaded, p50_loaded = statistics.median(unloaded), statistics.median(loaded)
    out = {
        "b_failed": failed,
        "b_ttft_p50_unloaded_s": round(p50_unloaded, 4),
        "b_ttft_p50_loaded_s": round(p50_loaded, 4),
        "b_ttft_ratio": round(p50_loaded / p50_unloaded, 2),
        "b_ttft_loaded_s": [round(x, 4) for x in loaded],
        "b_finished_after_s": round(b_done, 2),
        "a_completed": sum(1 for _, ok in results if ok),
        "a_requests": args.a_requests,
        "a_flood_s": round(flood_s, 2),
    }
    print(f"  {config}: B TTFT p50 {p50_unloaded * 1e3:.0f} ms unloaded, {p50_loaded * 1e3:.0f} ms under A's flood "
          f"({out['b_ttft_ratio']}x); A {out['a_completed']}/{args.a_requests} completed in {flood_s:.1f} s",
          file=sys.stderr)  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--a-requests", type=int, default=64)
    parser.add_argument("--a-tokens", type=int, default=128)
    parser.add_argument("--b-requests", type=int, default=12)
    parser.add_argument("--b-every-s", type=float, default=2.0, help="B sends one request this often")
    parser.add_argument("--slots", type=int, default=8, help="the replica's --max-num-seqs")
    parser.add_argument("--configs", default="fcfs,fair")
    parser.add_argument("--reserved", type=int, default=1, help="fair: reserved_per_replica")
    parser.add_argument("--out", default="fairness", help="results/NAME.json")
    args = parser.parse_args()
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
        for r in range(args.rounds):
            for config in args.configs.split(","):
                proc, url = start(Path(tmp), config, args.slots, args.reserved)
                try:
                    print(f"round {r + 1}, {config}, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
                    rounds.append({"round": r + 1, "config": config, "load_1m": round(os.getloadavg()[0], 2),
                                   **asyncio.run(run(url, config, args))})  # fmt: skip
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
                write(args, rounds)  # after each configuration: a run cut short keeps what it measured


def write(args: argparse.Namespace, rounds: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": " ".join(["python", *sys.argv]),
        "host": {"cpu": cpu_model(), "cores": os.cpu_count(), "note": "a shared machine: absolute times are noise"},
        "settings": vars(args),
        "rounds": rounds,
    }
    path = RESULTS / f"{args.out}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
