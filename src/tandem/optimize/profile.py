"""measure_profile: what one replica of a recipe can do on this hardware, measured, as a Profile.

The scheduling layer sizes fleets from these numbers, so each is measured, never assumed: decode
output tokens/s at several concurrencies, prefill tokens/s, time to first token, memory, and the
cold start (load + optimize + first token).

A replica of one thread is timed on the process's CPU clock (`time.process_time`): on a core of its
own that is the wall time, and on a shared machine (a laptop, a CI host running other work) it leaves
out the time other processes held the core, so the Profile says what the hardware does, not what the
neighbours left. (Two Profiles measured minutes apart on a busy 2-core host came out 2x apart by wall
time.) With more threads the CPU clock would count threads waiting on each other, so wall time is used
and the machine should be quiet. `extra["clock"]` says which.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch

from tandem.contracts import Profile
from tandem.engine import Engine, EngineConfig, SamplingParams
from tandem.model.loader import load_model
from tandem.optimize.registry import apply_recipe

__all__ = ["measure_profile", "decode_rate", "hardware_name", "synthetic_prompt"]


def hardware_name() -> str:
    return f"cpu-{os.cpu_count()}c-{torch.backends.cpu.get_cpu_capability().lower()}"


def synthetic_prompt(vocab_size: int, length: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (length,), generator=g).tolist()


def decode_rate(
    engine: Engine, prompts: list[list[int]], new_tokens: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Output tokens/s of len(prompts) concurrent sequences, timed once all are prefilled (on `clock`:
    wall time, or time.process_time for the CPU time this process spent)."""
    params = SamplingParams.greedy_params(new_tokens, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    while any(s.in_prefill for s in engine.batcher.running) or engine.batcher.waiting:
        engine.step()
    produced, start = 0, clock()
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    return produced / (clock() - start)


def measure_profile(
    model_dir: str | Path | None,
    recipe: str,
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    prompt_len: int = 64,
    new_tokens: int = 32,
    max_model_len: int | None = None,
    threads: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> Profile:
    """`progress(what, done, total)` is told as each step begins (load, TTFT, prefill, each batch size)."""
    steps = ["loading and optimizing", "time to first token", "prefill", *(f"decode at batch {b}" for b in batch_sizes)]

    def begin(index: int) -> None:
        if progress is not None:
            progress(steps[index], index, len(steps))

    begin(0)
    t0 = time.perf_counter()
    model = load_model(model_dir)
    optimized = apply_recipe(model, recipe)
    max_slots = max(batch_sizes)
    engine_max_len = max_model_len or min(model.config.max_position_embeddings, 2048)
    config = EngineConfig(
        max_model_len=engine_max_len,
        kv_cache_tokens=engine_max_len * max_slots,
        max_num_seqs=max_slots,
        max_prefill_tokens=max(512, prompt_len * max_slots),
        num_threads=threads,
        enable_prefix_caching=False,  # the same prompts run again: measure computing them, not a cache hit
    )
    engine = Engine(optimized, config)
    single = torch.get_num_threads() == 1
    clock = time.process_time if single else time.perf_counter
    prompt_len = min(prompt_len, engine.max_model_len - new_tokens - 1)
    vocab = model.config.vocab_size
    first = engine.add_request(synthetic_prompt(vocab, prompt_len, 0), SamplingParams.greedy_params(1))
    while not any(o.request_id == first for o in engine.step()):
        pass
    cold_start = time.perf_counter() - t0
    # Time to first token of a lone request, and prefill throughput of a long prompt.
    begin(1)
    ttfts = []
    for seed in range(5):
        start = clock()
        engine.generate([synthetic_prompt(vocab, prompt_len, seed)], SamplingParams.greedy_params(1))
        ttfts.append(clock() - start)
    begin(2)
    long_len = min(512, engine.max_model_len - 2)
    start = clock()
    engine.generate([synthetic_prompt(vocab, long_len, 99)], SamplingParams.greedy_params(1))
    prefill_rate = long_len / (clock() - start)
    prompts = [synthetic_prompt(vocab, prompt_len, seed=i) for i in range(max(batch_sizes))]
    decode_rate(engine, prompts[:1], 4)  # warm-up
    decode = {}
    for index, b in enumerate(batch_sizes, start=3):
        begin(index)
        decode[b] = decode_rate(engine, prompts[:b], new_tokens, clock)
    weight_bytes = optimized.model.weight_bytes
    kv_dtype = engine.runner.cache.k[0].dtype
    kv_per_token = model.config.kv_bytes_per_token_per_element * (torch.finfo(kv_dtype).bits // 8)
    draft = getattr(optimized.speculator, "draft", None)
    if draft is not None:
        weight_bytes += draft.weight_bytes
        kv_per_token += draft.config.kv_bytes_per_token_per_element * (torch.finfo(draft.dtype).bits // 8)
    return Profile(
        recipe=optimized.recipe,
        hardware=hardware_name(),
        model=model.name,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_per_token,
        max_slots=engine.batcher.num_slots,
        decode_tokens_per_s=decode,
        prefill_tokens_per_s=prefill_rate,
        ttft_s_p50=statistics.median(ttfts),
        cold_start_s=cold_start,
        max_model_len=engine.max_model_len,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra={
            "prompt_len": prompt_len,
            "new_tokens": new_tokens,
            "threads": torch.get_num_threads(),
            "clock": "process cpu" if single else "wall",
            "acceptance_rate": engine.acceptance_rate,
            "mean_acceptance_length": engine.mean_acceptance_length,
        },
    )
