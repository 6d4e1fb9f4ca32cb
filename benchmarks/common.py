"""Shared helpers for benchmarks: the fixed 134M benchmark model, bandwidth, environment, recording."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
BENCH_134M = dict(
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=12,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    bos_token_id=0,
    eos_token_id=1,
)


def build_bench_model(out: Path, seed: int = 0) -> Path:
    """The 134M-parameter Llama of the benchmarks: random weights from a fixed seed, HF format."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if (out / "model.safetensors").is_file():
        return out
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**BENCH_134M))
    model.save_pretrained(out)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["def f(x):\n    return x * 2\n"] * 10, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return out


def memory_read_bandwidth(size_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes/s of reading a 1 GiB float32 tensor with all torch threads (best of `repeats`)."""
    x = torch.ones(size_bytes // 4, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return size_bytes / best


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages, recorded around runs on this shared machine."""
    return [round(x, 2) for x in os.getloadavg()]


def environment() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        cpu = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if "Model name" in line), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
    }


def record(name: str, payload: dict) -> Path:
    """Write results/<name>.json with the command that produced it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "environment": environment(), **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
