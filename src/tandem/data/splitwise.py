"""Profiles for accelerators, built from the splitwise GPU timings (splitwise_perf_model.csv).

The CSV holds measured runs of Llama2-70B and BLOOM-176B on A100-80GB, H100-80GB and power-capped
H100, at several tensor-parallel degrees: `prompt_time` (ms to prefill one prompt) by prompt size
and `token_time` (ms per decode iteration) by batch size. `splitwise_profile` turns one
MODEL/HARDWARE (and one tensor-parallel degree) into a Profile:

- decode: output tokens/s at batch b = b x 1000 / token_time(b), the mean of the repeated runs
  at the CSV's batch sweep (prompt 512, 128 generated tokens);
- prefill: prompt tokens/s at the measured prompt size nearest `typical_prompt_tokens` (default 1024,
  the conversation trace's median prompt is 1,020): prefill costs a fixed overhead plus a per-token
  part, so one rate is right for prompts near that size; every size's rate is kept in `extra`;
- TTFT p50: that prompt's prefill time; accelerators per replica: the tensor-parallel degree;
- memory: the model's weights (its parameter count at 16 bits, or `weight_bits`) and the KV cache
  that fits in the rest of the replica's accelerators at `memory_utilization` (vLLM's default 0.9);
- cold start: not in the data. Default 60 s: a replica of a large model takes about a minute to
  start (fetching and loading 138 GB of fp16 weights onto the devices, then warming up);
  pass the figure you measured for your fleet.

`speedup` and `weight_bits` project the imported Profile (source "projected", the factor stated
in `source_note`): e.g. what a recipe that decodes 1.66x faster on this CPU would need on an H100
if the same factor held there. Standard library only; the scheduling side may use it.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tandem.contracts import Profile
from tandem.data import ATTRIBUTION, SPLITWISE_TIMINGS, data_path

__all__ = ["HARDWARE_MEMORY_BYTES", "MODEL_SHAPES", "ModelShape", "splitwise_profile", "splitwise_targets"]

GIB = 1 << 30
DEFAULT_COLD_START_S = 60.0
DECODE_SWEEP_PROMPT = 512  # the CSV varies the batch at this prompt size
DECODE_SWEEP_TOKENS = 128  # ... and this many generated tokens


@dataclass(frozen=True)
class ModelShape:
    """What the timings do not say about a model: its size and its KV cache per token (from its HF config)."""

    parameters: int
    layers: int
    kv_heads: int
    head_dim: int
    max_model_len: int
    config: str  # where the numbers come from

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_element  # keys and values


MODEL_SHAPES = {
    # meta-llama/Llama-2-70b-hf config.json: 80 layers, 64 heads of 128, 8 KV heads (GQA), 4096 positions.
    "llama2-70b": ModelShape(68_976_648_192, 80, 8, 128, 4096, "meta-llama/Llama-2-70b-hf config.json"),
    # bigscience/bloom config.json: 70 layers, 112 heads of 128 (no GQA), 2048-token training context.
    "bloom-176b": ModelShape(176_247_271_424, 70, 112, 128, 2048, "bigscience/bloom config.json"),
}
HARDWARE_MEMORY_BYTES = {"a100-80gb": 80 * GIB, "h100-80gb": 80 * GIB, "h100-80gb-pcap": 80 * GIB}


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    needed = {"model", "hardware", "prompt_size", "batch_size", "token_size", "prompt_time", "token_time"}
    if rows and not needed <= set(rows[0]):
        raise ValueError(f"{path}: expected the splitwise columns {', '.join(sorted(needed))}")
    return rows


def splitwise_targets(path: Path | None = None) -> dict[str, list[int]]:
    """Every MODEL/HARDWARE in the timings and the tensor-parallel degrees measured for it."""
    found: dict[str, set[int]] = defaultdict(set)
    for row in _read(path or data_path(SPLITWISE_TIMINGS)):
        found[f"{row['model']}/{row['hardware']}"].add(int(row["tensor_parallel"]))
    return {k: sorted(v) for k, v in sorted(found.items())}


def _mean_by(rows, key: str, value: str) -> dict[int, float]:
    groups: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        groups[int(row[key])].append(float(row[value]))
    return {k: statistics.fmean(v) for k, v in sorted(groups.items())}


def _decode_rates(rows) -> dict[int, float]:
    sweep = [
        r for r in rows if int(r["prompt_size"]) == DECODE_SWEEP_PROMPT and int(r["token_size"]) == DECODE_SWEEP_TOKENS
    ]
    return {batch: batch * 1000.0 / ms for batch, ms in _mean_by(sweep, "batch_size", "token_time").items()}


def _per_accelerator(decode: dict[int, float], tensor_parallel: int) -> float:
    return decode[max(decode)] / tensor_parallel if decode else 0.0


def splitwise_profile(
    target: str,
    *,
    tensor_parallel: int | None = None,
    cold_start_s: float = DEFAULT_COLD_START_S,
    typical_prompt_tokens: int = 1024,
    memory_utilization: float = 0.9,
    speedup: float = 1.0,
    weight_bits: int = 16,
    recipe: str | None = None,
    path: Path | None = None,
) -> Profile:
    """The Profile of one replica of MODEL on HARDWARE (`target` = "llama2-70b/h100-80gb").

    `tensor_parallel` None picks the measured degree with the most decode tokens/s per accelerator
    at the largest measured batch (the cheapest way to serve; 2 for Llama2-70B).
    """
    path = path or data_path(SPLITWISE_TIMINGS)
    model, _, hardware = target.partition("/")
    targets = splitwise_targets(path)
    if target not in targets:
        raise ValueError(f"no splitwise timings for {target!r} (known: {', '.join(targets)})")
    if model not in MODEL_SHAPES or hardware not in HARDWARE_MEMORY_BYTES:
        raise ValueError(f"{target!r}: tandem does not know this model's size or this hardware's memory")
    if cold_start_s < 0 or speedup <= 0 or weight_bits not in (4, 8, 16) or not 0 < memory_utilization <= 1:
        raise ValueError("need cold_start_s >= 0, speedup > 0, weight_bits 4, 8 or 16, memory_utilization in (0, 1]")
    rows = [r for r in _read(path) if f"{r['model']}/{r['hardware']}" == target]
    by_tp = {tp: [r for r in rows if int(r["tensor_parallel"]) == tp] for tp in targets[target]}
    if tensor_parallel is None:
        tensor_parallel = max(by_tp, key=lambda tp: _per_accelerator(_decode_rates(by_tp[tp]), tp))
    if tensor_parallel not in by_tp:
        raise ValueError(f"{target}: tensor-parallel degree {tensor_parallel} not measured (measured: {sorted(by_tp)})")
    rows = by_tp[tensor_parallel]
    decode = _decode_rates(rows)
    prompt_ms = _mean_by(
        [r for r in rows if int(r["batch_size"]) == 1 and int(r["token_size"]) == DECODE_SWEEP_TOKENS],
        "prompt_size",
        "prompt_time",
    )
    if not decode or not prompt_ms:
        raise ValueError(f"{target} at tensor parallel {tensor_parallel}: no batch or prompt sweep in {path}")
    typical = min(prompt_ms, key=lambda size: (abs(size - typical_prompt_tokens), size))

    shape = MODEL_SHAPES[model]
    weight_bytes = shape.parameters * weight_bits // 8
    kv_per_token = shape.kv_bytes_per_token()
    free = int(tensor_parallel * HARDWARE_MEMORY_BYTES[hardware] * memory_utilization) - weight_bytes
    if free < kv_per_token * shape.max_model_len:
        raise ValueError(f"{target}: {weight_bytes / GIB:.0f} GiB of weights leave no room for one full-context "
                         f"sequence on {tensor_parallel} accelerator(s); use a higher --tensor-parallel")  # fmt: skip

    projected = speedup != 1.0 or weight_bits != 16
    tp_note = f"tensor parallel {tensor_parallel}"
    note = (
        f"imported: {SPLITWISE_TIMINGS} rows {target} at {tp_note} ({len(rows)} runs; decode from token_time at "
        f"batch {min(decode)}-{max(decode)}, prefill from prompt_time at {typical} tokens); "
        f"cold start {cold_start_s:g} s assumed, not measured"
    )
    if projected:
        note += f"; projected: decode and prefill x{speedup:g}, weights at {weight_bits} bits"
    return Profile(
        recipe=recipe or ("fp16" if not projected else f"fp16 x{speedup:g}"),
        hardware=hardware,
        model=model,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_per_token,
        max_slots=max(decode),
        decode_tokens_per_s={b: rate * speedup for b, rate in decode.items()},
        prefill_tokens_per_s=typical * 1000.0 / prompt_ms[typical] * speedup,
        ttft_s_p50=prompt_ms[typical] / 1000.0 / speedup,
        cold_start_s=cold_start_s,
        max_model_len=shape.max_model_len,
        extra={
            "attribution": ATTRIBUTION[SPLITWISE_TIMINGS],
            "model_config": shape.config,
            "tensor_parallel": tensor_parallel,
            "token_time_ms_by_batch": {str(b): round(b * 1000.0 / r, 3) for b, r in decode.items()},
            "prompt_time_ms_by_size": {str(s): round(ms, 3) for s, ms in prompt_ms.items()},
            "memory_utilization": memory_utilization,
            "speedup": speedup,
            "weight_bits": weight_bits,
        },
        source="projected" if projected else "imported",
        source_note=note,
        accelerators=tensor_parallel,
        kv_cache_tokens=free // kv_per_token,
    )
