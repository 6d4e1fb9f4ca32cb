"""tandem vs llama.cpp on the same 134M Llama, same machine, one run: decode tok/s at batch 1/8/32
with 64-token prompts and batch 8 with 1536-token prompts, and prefill of a 512-token prompt.

    .venv/bin/python benchmarks/bench_vs_llamacpp.py [--peer /tmp/peer] [--build] [--rounds 3]

The peer is llama.cpp's `llama-batched-bench` and the model as GGUF f32/bf16/q8_0, built by
benchmarks/peer/build.sh (about 10 minutes on 2 cores; `--build` runs it). Without it this
prints how to build it and exits 0 (skipped). Measured as that folder's compare.py measures: 64 new
tokens per sequence, 2 threads, llama.cpp's decode rate S_TG against tandem's rate once every
sequence is prefilled; prefill is llama.cpp's S_PP against tandem's time to the first token.
Every tandem engine is built first; each round then runs every tandem row and every llama.cpp
precision once (the machine is shared: rounds spread its slow spells over all rows), and each row
keeps its best round. Also recorded: the load average around each round, the measured memory read
bandwidth, and each recipe's batch-1 step against its bandwidth bound (weight bytes read per step /
read bandwidth). JSON: benchmarks/results/vs_llamacpp.json (with the command).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import memory_read_bandwidth, record
from rich.console import Console
from rich.table import Table

from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.kernels import KernelLinear
from tandem.model import load_model
from tandem.optimize import apply_recipe
from tandem.optimize.profile import decode_rate, synthetic_prompt

RECIPES = "baseline,bf16,int8,int4,int8+kv-bf16,int4+kv-bf16"
PEER_TYPES = ("f32", "bf16", "q8_0")
BUILD_SCRIPT = Path(__file__).resolve().parent / "peer" / "build.sh"
NEW_TOKENS = 64
FALLBACKS: set[str] = set()  # GGUFs whose default run crashed and were measured with -nr
console = Console()


def find_peer(peer: Path) -> tuple[Path, dict[str, Path]] | None:
    bench = next(peer.glob("llama_cpp_python-*/vendor/llama.cpp/build/bin/llama-batched-bench"), None)
    ggufs = {t: peer / f"bench134m-{t}.gguf" for t in PEER_TYPES}
    if bench is None or not all(p.is_file() for p in ggufs.values()) or not (peer / "bench134m").is_dir():
        return None
    return bench, ggufs


def llama_cpp(bench: Path, gguf: Path, prompt_len: int, new_tokens: int, batches, threads: int) -> dict[int, tuple]:
    """{batch: (S_PP, S_TG)} from one llama-batched-bench run. A run that crashes is retried once
    with weight repacking off (-nr): on this AMX machine llama.cpp's repacked q8_0 path dies with a
    protection fault or an illegal instruction, now and then or every time."""
    ctx = (prompt_len + new_tokens + 64) * max(batches)
    command = [
        *(str(bench), "-m", str(gguf), "-c", str(ctx), "-b", "2048", "-ub", "512"),
        *("-npp", str(prompt_len), "-ntg", str(new_tokens), "-npl", ",".join(map(str, batches))),
        *("-t", str(threads), "-tb", str(threads)),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        FALLBACKS.add(gguf.name)
        done = subprocess.run([*command, "-nr"], capture_output=True, text=True, check=True)
    rates = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0] == str(prompt_len) and re.fullmatch(r"\d+", cells[2]):
            rates[int(cells[2])] = (float(cells[5]), float(cells[7]))
    return rates


def decode_bytes(module: torch.nn.Module) -> int:
    """Bytes a batch-1 decode step streams: each Linear's weights as its kernel reads them (packed
    quantized weights, or the float weights), norms, one embedding row."""
    total = 0
    for m in module.modules():
        spec = m.kernel_linear() if isinstance(m, KernelLinear) else None
        if spec is not None:
            total += spec[0].nbytes + (0 if spec[1] is None else spec[1].numel() * 4)
        elif hasattr(m, "in_features") and hasattr(m, "out_features"):
            total += getattr(m, "weight_bytes", 0) or m.in_features * m.out_features * 4
        elif isinstance(m, torch.nn.Embedding):
            total += m.weight.shape[1] * m.weight.element_size()
    norms = sum(p.numel() * p.element_size() for n, p in module.named_parameters() if "norm" in n)
    return total + norms


def prefill_rate(engine: Engine, prompt: list[int]) -> float:
    start = time.perf_counter()
    engine.generate([prompt], SamplingParams.greedy_params(1))
    return len(prompt) / (time.perf_counter() - start)


def load_average() -> float:
    return os.getloadavg()[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", type=Path, default=Path("/tmp/peer"))
    p.add_argument("--build", action="store_true", help=f"build the peer first if absent ({BUILD_SCRIPT})")
    p.add_argument("--recipes", default=RECIPES)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", default="1,8,32", help="batch sizes with short prompts")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--long-prompt-len", type=int, default=1536)
    p.add_argument("--long-batches", default="8", help="batch sizes with long prompts ('' to skip)")
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default="vs_llamacpp", help="results/<name>.json")
    a = p.parse_args()
    peer = find_peer(a.peer)
    if peer is None and a.build:
        subprocess.run(["bash", str(BUILD_SCRIPT)], env={**os.environ, "PEER": str(a.peer)}, check=True)
        peer = find_peer(a.peer)
    if peer is None:
        console.print(
            f"SKIPPED: no llama.cpp peer under {a.peer}. Build it with `PEER={a.peer} bash {BUILD_SCRIPT}` "
            "(about 10 minutes on 2 cores) or pass --build."
        )
        return 0
    bench, ggufs = peer
    torch.set_num_threads(a.threads)
    workloads = [(a.prompt_len, tuple(int(b) for b in a.batches.split(",")))]
    if a.long_batches:
        workloads.append((a.long_prompt_len, tuple(int(b) for b in a.long_batches.split(","))))
    recipes = a.recipes.split(",")

    # Every engine first: one per recipe and prompt length, sized for its largest batch (the longest
    # prompts' engine also serves the prefill prompt). A recipe's engines share its weights.
    longest = max(n for n, _ in workloads)
    engines: dict[tuple[str, int], Engine] = {}
    step_bytes: dict[str, int] = {}
    for recipe in recipes:
        optimized = apply_recipe(load_model(a.peer / "bench134m"), recipe)
        step_bytes[recipe] = decode_bytes(optimized.model.module)
        for prompt_len, batches in workloads:
            ctx = (max(prompt_len, a.prefill_len) if prompt_len == longest else prompt_len) + NEW_TOKENS + 64
            config = EngineConfig(
                max_model_len=ctx,
                kv_cache_tokens=ctx * max(batches),
                max_num_seqs=max(batches),
                max_prefill_tokens=max(512, a.prefill_len),
                num_threads=a.threads,
            )
            engines[recipe, prompt_len] = engine = Engine(optimized, config)
            decode_rate(engine, [synthetic_prompt(32000, prompt_len, seed=99)], 4)  # warm-up
    prompts = {n: [synthetic_prompt(32000, n, seed=i) for i in range(max(b))] for n, b in workloads}
    prefill_prompt = synthetic_prompt(32000, a.prefill_len, seed=123)

    best: dict[tuple[str, int, int], float] = {}  # (row, prompt_len, batch) -> decode tok/s
    prefill: dict[str, float] = {}

    def keep(key, value, table=best):
        table[key] = max(table.get(key, 0.0), value)

    def report(rounds_done: int, show: bool) -> Path:
        rows = sorted({k[0] for k in best}, key=lambda n: (not n.startswith("tandem"), n))
        columns = [(n, b) for n, batches in workloads for b in batches]
        table = Table(
            title=f"decode tok/s, best of {rounds_done} rounds ({a.threads} threads); prefill {a.prefill_len} tok/s"
        )
        table.add_column("engine")
        for n, b in columns:
            table.add_column(f"{n}-tok bs {b}", justify="right")
        table.add_column("prefill", justify="right")
        for name in rows:
            table.add_row(
                name, *(f"{best.get((name, n, b), 0):.1f}" for n, b in columns), f"{prefill.get(name, 0):.0f}"
            )
        ratios, same_precision = {}, {}
        peers = {"baseline": "f32", "bf16": "bf16", "int8": "q8_0", "int8+kv-bf16": "q8_0"}
        for n, b in columns:
            ours = {k[0]: v for k, v in best.items() if k[1:] == (n, b) and k[0].startswith("tandem")}
            theirs = max(v for k, v in best.items() if k[1:] == (n, b) and k[0].startswith("llama.cpp"))
            ratios[f"{n}|{b}"] = {"best": max(ours.values()) / theirs, **{k: v / theirs for k, v in ours.items()}}
            same_precision[f"{n}|{b}"] = {
                recipe: best[f"tandem {recipe}", n, b] / best[f"llama.cpp {t}", n, b]
                for recipe, t in peers.items()
                if (f"tandem {recipe}", n, b) in best
            }
        prefill_ratio = max(v for k, v in prefill.items() if k.startswith("tandem")) / max(
            v for k, v in prefill.items() if k.startswith("llama.cpp")
        )
        table.add_row("tandem best / llama.cpp best", *(f"{ratios[f'{n}|{b}']['best']:.2f}x" for n, b in columns),
                      f"{prefill_ratio:.2f}x")  # fmt: skip
        if show:
            console.print(table)
        bound = {}
        if 1 in workloads[0][1]:
            for recipe in recipes:
                rate = best[f"tandem {recipe}", a.prompt_len, 1]
                ideal_ms = 1e3 * step_bytes[recipe] / bandwidth[0]
                bound[recipe] = {"step_ms": 1e3 / rate, "bytes_per_step": step_bytes[recipe], "bound_ms": ideal_ms,
                                 "fraction_of_bound": ideal_ms / (1e3 / rate)}  # fmt: skip
                if not show:
                    continue
                console.print(
                    f"{recipe:16s} batch 1: {1e3 / rate:.2f} ms/step, {step_bytes[recipe] / 1e6:.0f} MB read per step, "
                    f"bound {ideal_ms:.2f} ms at {bandwidth[0] / 1e9:.1f} GB/s: {ideal_ms * rate / 10:.0f}% of it"
                )
        path = record(
            a.name,
            {
                "rounds": rounds_done,
                "threads": a.threads,
                "new_tokens": NEW_TOKENS,
                "workloads": {str(n): list(b) for n, b in workloads},
                "load_average_per_round": loads,
                "read_bandwidth_bytes_per_s": bandwidth[0],
                "decode_tokens_per_s": {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in best.items()},
                "prefill_tokens_per_s": prefill,
                "ratio_vs_llamacpp_best": ratios,
                "ratio_vs_llamacpp_same_precision": same_precision,
                "prefill_ratio": prefill_ratio,
                "batch1_bandwidth_bound": bound,
                "llamacpp_runs_retried_without_repacking": sorted(FALLBACKS),
            },
        )
        return path

    bandwidth = [memory_read_bandwidth()]  # the best of a measure before the rounds and one after each
    loads = []
    for r in range(a.rounds):
        load_before = load_average()
        for prompt_len, batches in workloads:
            for recipe in recipes:
                engine = engines[recipe, prompt_len]
                for b in batches:
                    keep((f"tandem {recipe}", prompt_len, b), decode_rate(engine, prompts[prompt_len][:b], NEW_TOKENS))
            for t, gguf in ggufs.items():
                for b, (_, tg) in llama_cpp(bench, gguf, prompt_len, NEW_TOKENS, batches, a.threads).items():
                    keep((f"llama.cpp {t}", prompt_len, b), tg)
        for recipe in recipes:
            keep(f"tandem {recipe}", prefill_rate(engines[recipe, longest], prefill_prompt), prefill)
        for t, gguf in ggufs.items():
            pp = llama_cpp(bench, gguf, a.prefill_len, 1, (1,), a.threads)[1][0]
            keep(f"llama.cpp {t}", pp, prefill)
        loads.append((load_before, load_average()))
        bandwidth[0] = max(bandwidth[0], memory_read_bandwidth())
        console.print(f"round {r + 1}/{a.rounds} done (load average {loads[-1][0]:.1f} -> {loads[-1][1]:.1f})")
        report(r + 1, show=False)  # kept after every round: a long run stopped early still has its rounds

    console.print(f"recorded {report(a.rounds, show=True)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
