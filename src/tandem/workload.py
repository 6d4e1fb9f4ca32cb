"""The bench workload: request lengths drawn from a real trace, prompt text from held-out code.

Standard library only (the tokenizer comes in as an argument), so both layers use it: `tandem
bench` (optimization layer) and `tandem gate` (scheduling side, which never imports torch).

Lengths come from the Azure LLM inference trace (shipped as tandem/data/azure_llm_conv_2023.csv, CC-BY 4.0,
Patel et al., "Splitwise", ISCA 2024), drawn with a fixed seed and scaled so the trace's long
requests fit the model's context; the shape of the distribution (prompts ~8x outputs, heavy tail)
is kept. Prompt text is held-out Python (never trained on), so speculation sees realistic text.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from tandem.data.bundled import heldout_sample_path
from tandem.data.traces import read_trace

__all__ = ["BenchRequest", "load_workload", "default_trace_path", "heldout_texts"]

REPO = Path(__file__).resolve().parents[2]
TRACE_P99_TOTAL = 4743  # trace p99 prompt (4142) + p99 output (601): scaled to the context


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    max_tokens: int


def default_trace_path() -> Path:
    from tandem.data import CONVERSATION_TRACE, data_path

    return data_path(CONVERSATION_TRACE)


def heldout_texts() -> list[str]:
    sample = heldout_sample_path()
    if sample.is_file():
        return [f["text"] for f in json.loads(sample.read_text())["files"]]
    # No bundled sample: fall back to this package's own source as prompt text.
    return [p.read_text() for p in sorted((REPO / "src" / "tandem").rglob("*.py"))]


def _trace_lengths(path: Path) -> list[tuple[int, int]]:
    return [(prompt, output) for _, prompt, output in read_trace(path, timed=False)]


def load_workload(
    tokenizer, max_model_len: int, num_requests: int, seed: int = 0, trace: Path | None = None, min_output: int = 8
) -> list[BenchRequest]:
    lengths = _trace_lengths(trace or default_trace_path())
    rng = random.Random(seed)
    picked = [lengths[rng.randrange(len(lengths))] for _ in range(num_requests)]
    scale = (max_model_len - 1) / TRACE_P99_TOTAL
    corpus = tokenizer.encode("\n\n".join(heldout_texts()), add_special_tokens=False)
    requests = []
    for prompt_tokens, output_tokens in picked:
        out = max(min_output, round(output_tokens * scale))
        prompt = max(4, min(round(prompt_tokens * scale), max_model_len - 1 - out))
        start = rng.randrange(max(1, len(corpus) - prompt))
        requests.append(BenchRequest(corpus[start : start + prompt], out))
    return requests
