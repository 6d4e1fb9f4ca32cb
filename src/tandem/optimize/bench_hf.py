"""The transformers rows of `tandem bench`: sequential `generate`, and static batching.

The same workload as tandem's rows, all requests arriving at t=0, greedy, exactly max_tokens per
request. A logits processor records when each batch's first token is chosen, for TTFT and TPOT.
"""

from __future__ import annotations

import time

import torch

from tandem.workload import BenchRequest

__all__ = ["run_hf_sequential", "run_hf_static_batch", "load_hf"]


class _FirstTokenTimer:
    """A logits processor that only notes when it is first called: right after the prefill forward,
    when the first token of every row in the batch is chosen. Works at any batch size."""

    def __init__(self) -> None:
        self.first_token_time: float | None = None

    def __call__(self, input_ids, scores):
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        return scores


def load_hf(model_dir, dtype: torch.dtype):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def _generate(hf, batch: list[BenchRequest], pad_id: int) -> tuple[float, float]:
    width = max(len(r.prompt_ids) for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(batch):  # left padding, as decoder-only batching needs
        ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        mask[i, width - len(r.prompt_ids) :] = 1
    new = max(r.max_tokens for r in batch)
    timer = _FirstTokenTimer()
    with torch.inference_mode():
        hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=pad_id,
            logits_processor=[timer],
        )
    end = time.perf_counter()
    return timer.first_token_time or end, end


def run_hf_sequential(hf, requests: list[BenchRequest], pad_id: int) -> list[tuple[float, float, float, int]]:
    """(arrival, first token, finish, tokens) per request, one `generate` at a time."""
    t0 = time.perf_counter()
    out = []
    for r in requests:
        first, end = _generate(hf, [r], pad_id)
        out.append((t0, first, end, r.max_tokens))
    return out


def run_hf_static_batch(
    hf, requests: list[BenchRequest], pad_id: int, batch_size: int
) -> list[tuple[float, float, float, int]]:
    """Fixed batches in arrival order; a batch runs until its longest request is done."""
    t0 = time.perf_counter()
    out = []
    for i in range(0, len(requests), batch_size):
        batch = requests[i : i + batch_size]
        first, end = _generate(hf, batch, pad_id)
        out += [(t0, first, end, r.max_tokens) for r in batch]
    return out
