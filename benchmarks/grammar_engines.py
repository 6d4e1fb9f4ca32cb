"""llguidance against xgrammar on the bundled tokenizer: schema compile time and mask time per token.

The same moderate JSON schema (7 fields: bounded string, integer range, string pattern, enum array
with min/max items, nested object, anyOf number|null, boolean) is compiled `--compiles` times under
distinct titles (no cache hit), then a valid instance is fed token by token, timing each mask. Each
engine uses its compact-whitespace mode, fed the instance in the separators it expects. Also
records whether each refuses schema keywords it does not implement. xgrammar is not a dependency of
tandem: `pip install xgrammar` to run its half (it is skipped otherwise).

    python benchmarks/grammar_engines.py [--compiles 8] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from common import record
from tokenizers import Tokenizer

from tandem.data.bundled import bundled_model_dir

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "zip"],
        },
        "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
}
INSTANCE = {
    "name": "alice smith",
    "age": 33,
    "email": "alice@example.com",
    "tags": ["a", "c"],
    "address": {"street": "main street 1", "zip": "12345"},
    "score": None,
    "active": True,
}
UNSUPPORTED = {"uniqueItems": {"type": "array", "uniqueItems": True}, "dependentSchemas": {"dependentSchemas": {}}}
VOCAB = 8192


def summary(compiles: list[float], masks: list[float]) -> dict:
    return {
        "compile_ms_median": round(statistics.median(compiles) * 1e3, 3),
        "mask_us_mean": round(statistics.mean(masks) * 1e6, 1),
        "mask_us_median": round(statistics.median(masks) * 1e6, 1),
        "mask_us_p90": round(sorted(masks)[int(0.9 * len(masks))] * 1e6, 1),
    }


def llguidance_run(tokenizer_json: str, ids: list[int], compiles: int, reps: int) -> dict:
    import torch
    from llguidance import LLMatcher, LLTokenizer

    tok = LLTokenizer(tokenizer_json, n_vocab=VOCAB, eos_token=1)
    opts = {"whitespace_flexible": False}
    times = []
    for i in range(compiles):
        started = time.perf_counter()
        LLMatcher(tok, LLMatcher.grammar_from_json_schema(json.dumps({**SCHEMA, "title": f"t{i}"}), defaults=opts))
        times.append(time.perf_counter() - started)
    bitmask = torch.full((1, VOCAB // 32), -1, dtype=torch.int32)
    masks = []
    for _ in range(reps):
        matcher = LLMatcher(tok, LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults=opts))
        for t in ids:
            started = time.perf_counter()
            matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), VOCAB // 8)
            masks.append(time.perf_counter() - started)
            assert matcher.consume_token(t), matcher.get_error()
    refused = {
        k: bool(LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(s), tok)) for k, s in UNSUPPORTED.items()
    }
    return {**summary(times, masks), "refuses_unimplemented_keywords": refused}


def xgrammar_run(ids: list[int], compiles: int, reps: int) -> dict | None:
    try:
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    path = bundled_model_dir() / "tokenizer.json"
    hf = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="</s>", bos_token="<s>")
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=VOCAB), cache_enabled=False)
    times = []
    for i in range(compiles):
        started = time.perf_counter()
        xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps({**SCHEMA, "title": f"t{i}"}), any_whitespace=False))
        times.append(time.perf_counter() - started)
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    masks = []
    for _ in range(reps):
        matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))
        for t in ids:
            started = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask, 0)
            masks.append(time.perf_counter() - started)
            assert matcher.accept_token(t)
    refused = {}
    for keyword, schema in UNSUPPORTED.items():
        try:
            compiler.compile_json_schema(json.dumps(schema))
            refused[keyword] = False
        except RuntimeError:
            refused[keyword] = True
    return {**summary(times, masks), "refuses_unimplemented_keywords": refused}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compiles", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    tokenizer_json = (bundled_model_dir() / "tokenizer.json").read_text()
    tok = Tokenizer.from_str(tokenizer_json)
    compact = tok.encode(json.dumps(INSTANCE, separators=(",", ":")), add_special_tokens=False).ids
    spaced = tok.encode(json.dumps(INSTANCE), add_special_tokens=False).ids
    results = {"llguidance": llguidance_run(tokenizer_json, compact, args.compiles, args.reps)}
    xgr = xgrammar_run(spaced, args.compiles, args.reps)
    if xgr is not None:
        results["xgrammar"] = xgr
    for name, r in results.items():
        print(
            f"{name:10} compile {r['compile_ms_median']:7.2f} ms   mask mean {r['mask_us_mean']:6.1f} us "
            f"median {r['mask_us_median']:6.1f} us p90 {r['mask_us_p90']:6.1f} us"
        )
        print(f"{'':10} refuses unimplemented keywords: {r['refuses_unimplemented_keywords']}")
    path = record("grammar_engines", {"schema": SCHEMA, "instance_tokens": len(compact), **results})
    print(f"recorded {path}")


if __name__ == "__main__":
    main()
