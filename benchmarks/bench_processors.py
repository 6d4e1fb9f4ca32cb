"""What logits processors cost an engine step at the request bounds (tandem.serve.bounds), with the
tables precomputed once per request (tandem.engine.processor_tables) against the per-step Python
loops they replaced (reproduced here as `legacy_*`, the code before the change), side by side in
one run on the same logits.

Each case is one engine step's processing of B rows (the choices of n=16 requests), every row at a
bound: 256 bad words (their token sequences, up to 64 tokens each, the output ending in several of
their prefixes), 1,024 logit_bias entries, stop_token_ids of the whole vocabulary with min_tokens
not yet reached, logprobs 20 (the sampler's part), and all of them at once. Also what a request pays
once: building its tables (and tokenizing 256 bad words with the bundled tokenizer), which the
server does in a worker thread, once per request rather than once per choice on the engine thread.

    python benchmarks/bench_processors.py            # writes benchmarks/results/processors.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import load_average, record  # noqa: E402

from tandem.engine.outputs import RequestMetrics  # noqa: E402
from tandem.engine.processor_tables import MAX_BAD_WORD_TOKENS, ProcessorTables, prepare_tables  # noqa: E402
from tandem.engine.processors import LogitsRow, _penalize, process_logits  # noqa: E402
from tandem.engine.sampler import _logprob_entry, filtered_probs, sample  # noqa: E402
from tandem.engine.sampling_params import SamplingParams  # noqa: E402
from tandem.engine.sequence import Sequence  # noqa: E402

EOS = 1


# --- the code before the change (per-step Python over every word, entry and stop id) ---------------
def _legacy_banned(row: LogitsRow) -> list[int]:
    seq, output = row.seq, row.output_ids
    banned = []
    for word in seq.bad_word_ids:
        prefix = len(word) - 1
        if prefix == 0 or (prefix <= len(output) and tuple(output[len(output) - prefix :]) == word[:-1]):
            banned.append(word[-1])
    if len(output) < seq.params.min_tokens:
        banned += [*seq.eos_ids, *seq.params.stop_token_ids]
    return banned


def _legacy_index(pairs, vocab):
    kept = [(r, t) for r, t in pairs if t < vocab]
    return torch.tensor([r for r, _ in kept], dtype=torch.long), torch.tensor([t for _, t in kept], dtype=torch.long)


def legacy_process_logits(logits: torch.Tensor, rows: list[LogitsRow]) -> torch.Tensor:
    active = [i for i, row in enumerate(rows) if row.seq.params.processes_logits]
    if not active:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    banned, biased, bias_values, penalized = [], [], [], []
    for i in active:
        params = rows[i].seq.params
        banned += [(i, t) for t in _legacy_banned(rows[i])]
        for token, bias in params.logit_bias:
            if token < vocab:
                biased.append((i, token))
                bias_values.append(bias)
        if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
            penalized.append(i)
    if biased:
        logits.index_put_(_legacy_index(biased, vocab), torch.tensor(bias_values, dtype=logits.dtype), accumulate=True)
    if penalized:
        _penalize(logits, list(rows), penalized)
    if banned:
        logits[_legacy_index(banned, vocab)] = float("-inf")
    return logits


def legacy_sample(logits: torch.Tensor, params: list[SamplingParams], generators: list) -> tuple[list, list]:
    """The sampler before the change: logprobs with one top-k per row."""
    greedy_tokens = logits.argmax(dim=-1).tolist()
    tokens = []
    for row, p in enumerate(params):
        if p.greedy:
            tokens.append(greedy_tokens[row])
        else:
            probs = filtered_probs(logits[row], p)
            tokens.append(int(torch.multinomial(probs, 1, generator=generators[row]).item()))
    out = [None] * len(params)
    wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
    if wanted:
        logprobs = torch.log_softmax(logits[wanted], dim=-1)
        for i, row in enumerate(wanted):
            out[row] = _logprob_entry(logprobs[i], tokens[row], params[row].logprobs)
    return tokens, out


# --- the cases --------------------------------------------------------------------------------------
def bad_word_ids(rng: random.Random, vocab: int, count: int = 512) -> list[tuple[int, ...]]:
    """256 words -> up to 512 token sequences (bare and spaced), 1..64 tokens each."""
    return [tuple(rng.randrange(2, vocab) for _ in range(rng.randint(1, MAX_BAD_WORD_TOKENS))) for _ in range(count)]


def make_rows(case: str, batch: int, vocab: int, rng: random.Random) -> list[LogitsRow]:
    words = bad_word_ids(rng, vocab) if case in ("bad_words", "all") else []
    bias = {t: 0.5 for t in rng.sample(range(vocab), 1024)} if case in ("logit_bias", "all") else {}
    stops = tuple(range(vocab)) if case in ("stop_token_ids", "all") else ()
    params = SamplingParams(
        max_tokens=400, min_tokens=300 if stops else 0, stop_token_ids=stops, logit_bias=bias,
        bad_words=("x",) if words else (), logprobs=20 if case in ("logprobs", "all") else None,
        temperature=0.0,  # greedy: the sampler's own cost (torch.multinomial) is not the processors'
    )  # fmt: skip
    tables = ProcessorTables.build(params, {EOS}, words)
    rows = []
    for _ in range(batch):
        output = [rng.randrange(2, vocab) for _ in range(200)]
        for word in rng.sample(words, min(4, len(words))):  # the output ends in several words' prefixes
            if len(word) > 1:
                output[-(len(word) - 1) :] = word[:-1]
                break
        seq = Sequence("s", [0, 5, 6], params, None, frozenset({EOS}), 4096, RequestMetrics(0.0))
        seq.output_ids, seq.bad_word_ids, seq.tables = output, tuple(words), tables
        rows.append(LogitsRow(seq))
    return rows


def median_ms(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def run_case(case: str, batch: int, vocab: int, repeats: int) -> dict:
    rng = random.Random(0)
    rows = make_rows(case, batch, vocab, rng)
    logits = torch.randn(batch, vocab)
    params = [r.seq.params for r in rows]
    if case == "logprobs":  # the sampler's step: each row's token and its 20 alternatives
        generators = [torch.Generator().manual_seed(i) for i in range(batch)]
        ours = median_ms(lambda: sample(logits, params, generators), repeats)
        theirs = median_ms(lambda: legacy_sample(logits, params, generators), repeats)
    else:
        torch.testing.assert_close(process_logits(logits, rows), legacy_process_logits(logits, rows))
        ours = median_ms(lambda: process_logits(logits, rows), repeats)
        theirs = median_ms(lambda: legacy_process_logits(logits, rows), repeats)
    return {"case": case, "rows": batch, "vocab": vocab, "tables_ms": ours, "legacy_ms": theirs,
            "speedup": theirs / ours if ours else None}  # fmt: skip


def request_setup(repeats: int) -> dict:
    """Once per request: tokenizing 256 bad words (bundled tokenizer) and building the tables."""
    from tandem.data.bundled import bundled_model_dir
    from tandem.model import Tokenizer

    tok = Tokenizer(bundled_model_dir())
    words = tuple(f"w{i} " + "def f(x): return x " * 3 for i in range(256))
    params = SamplingParams(max_tokens=400, min_tokens=10, bad_words=words, stop_token_ids=tuple(range(8192)))
    encode = lambda w: tok.encode(w, add_special_tokens=False)  # noqa: E731
    once = median_ms(lambda: prepare_tables(params, {EOS}, encode), repeats)
    return {"bad_words": len(words), "stop_token_ids": 8192, "prepare_ms_once_per_request": once,
            "before_ms_per_request_n16": 16 * once}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--name", default="processors")
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = load_average()
    results = [
        run_case(case, batch, vocab, args.repeats)
        for vocab in (8192, 32000)
        for batch in (16, 64)
        for case in ("bad_words", "logit_bias", "stop_token_ids", "logprobs", "all")
    ]
    try:
        setup = request_setup(max(3, args.repeats // 4))
    except Exception as exc:  # the bundled model is optional in a dev checkout
        setup = {"skipped": str(exc)}
    print("| case | rows | vocab | tables ms/step | legacy ms/step | speedup |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['case']} | {r['rows']} | {r['vocab']} | {r['tables_ms']:.3f} | {r['legacy_ms']:.3f} | "
              f"{r['speedup']:.1f}x |")  # fmt: skip
    print("request setup:", setup)
    path = record(args.name, {"load_average": [before, load_average()], "torch_threads": 1, "results": results,
                              "request_setup": setup})  # fmt: skip
    print("wrote", path)


if __name__ == "__main__":
    main()
