"""Decode throughput: tandem vs transformers `generate`, fp32 and bf16, batch 1/8/32, one run.

The 134M Llama (hidden 768, 12 layers, intermediate 2048, 12 heads, vocab 32000, random weights,
seed 0). Every batch row has a 32-token prompt and decodes --new-tokens tokens (greedy, no eos).
Also measures this machine's memory read bandwidth and prints the batch-1 bound: weight bytes /
bandwidth, the time a decode step needs just to read the weights once.

    python benchmarks/bench_decode.py [--new-tokens 64] [--batches 1,8,32]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from common import build_bench_model, memory_read_bandwidth, record
from rich.console import Console
from rich.table import Table

from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model import load_model

PROMPT_LEN = 32


def prompts(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    return torch.randint(2, vocab, (batch, PROMPT_LEN), generator=g).tolist()


def time_tandem(model, batch: int, new_tokens: int) -> float:
    engine = Engine(
        model,
        EngineConfig(
            max_model_len=PROMPT_LEN + new_tokens + 1,
            kv_cache_tokens=(PROMPT_LEN + new_tokens + 1) * batch,
            max_num_seqs=batch,
        ),
    )
    params = SamplingParams.greedy_params(new_tokens, ignore_eos=True)
    engine.generate(prompts(batch, model.config.vocab_size), SamplingParams.greedy_params(4, ignore_eos=True))
    t0 = time.perf_counter()
    outs = engine.generate(prompts(batch, model.config.vocab_size), params)
    elapsed = time.perf_counter() - t0
    assert sum(len(o.token_ids) for o in outs) == batch * new_tokens
    return batch * new_tokens / elapsed


def time_hf(hf, batch: int, new_tokens: int, vocab: int) -> float:
    ids = torch.tensor(prompts(batch, vocab))
    kwargs = dict(do_sample=False, pad_token_id=1, eos_token_id=None)
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=4, min_new_tokens=4, **kwargs)
        t0 = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
        elapsed = time.perf_counter() - t0
    assert out.shape[1] == PROMPT_LEN + new_tokens
    return batch * new_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "tandem-bench-134m")
    args = parser.parse_args()
    import transformers

    batches = [int(b) for b in args.batches.split(",")]
    console = Console()
    model_dir = build_bench_model(args.model_dir)
    bandwidth = memory_read_bandwidth()
    rows = []
    for dtype in args.dtypes.split(","):
        model = load_model(model_dir, dtype=dtype)
        hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=model.dtype).eval()
        bound_s = model.weight_bytes / bandwidth
        for batch in batches:
            ours = time_tandem(model, batch, args.new_tokens)
            theirs = time_hf(hf, batch, args.new_tokens, model.config.vocab_size)
            rows.append(
                dict(
                    dtype=dtype,
                    batch=batch,
                    tandem_tokens_per_s=ours,
                    hf_tokens_per_s=theirs,
                    weight_bytes=model.weight_bytes,
                    bound_ms_per_token=bound_s * 1e3,
                )
            )
            console.print(f"{dtype} batch {batch}: tandem {ours:.1f} tok/s, transformers {theirs:.1f} tok/s")
        del model, hf
    hf1 = {r["dtype"]: r["hf_tokens_per_s"] for r in rows if r["batch"] == 1}
    table = Table(
        title=f"Decode, 134M Llama, {args.new_tokens} new tokens per row "
        f"(memory read bandwidth {bandwidth / 1e9:.1f} GB/s)"
    )
    for col in (
        "dtype",
        "batch",
        "tandem tok/s",
        "HF tok/s",
        "tandem/HF",
        "tandem ms/step",
        "bound ms",
        "step/bound",
        "vs HF batch 1",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        step_ms = 1e3 * r["batch"] / r["tandem_tokens_per_s"]
        r["ratio_vs_hf"] = r["tandem_tokens_per_s"] / r["hf_tokens_per_s"]
        r["tandem_ms_per_step"] = step_ms
        r["step_over_bound"] = step_ms / r["bound_ms_per_token"]
        r["ratio_vs_hf_batch1"] = r["tandem_tokens_per_s"] / hf1[r["dtype"]] if r["dtype"] in hf1 else None
        table.add_row(
            r["dtype"],
            str(r["batch"]),
            f"{r['tandem_tokens_per_s']:.1f}",
            f"{r['hf_tokens_per_s']:.1f}",
            f"{r['ratio_vs_hf']:.2f}x",
            f"{step_ms:.1f}",
            f"{r['bound_ms_per_token']:.1f}",
            f"{r['step_over_bound']:.2f}x",
            f"{r['ratio_vs_hf_batch1']:.2f}x" if r["ratio_vs_hf_batch1"] else "-",
        )
    console.print(table)
    path = record(
        "decode_134m",
        {"bandwidth_bytes_per_s": bandwidth, "new_tokens": args.new_tokens, "prompt_len": PROMPT_LEN, "rows": rows},
    )
    console.print(f"recorded {path}")


if __name__ == "__main__":
    main()
