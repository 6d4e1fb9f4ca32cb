"""Grammars in the engine, on the bundled model: every row of a batch keeps to its own grammar; a
complete grammar ends its sequence; speculative and n-gram verification give the same greedy output
under a grammar as plain decoding; penalties, min_tokens and the prefix cache keep working; the
compile cache holds one entry per spec; bad specs are RequestErrors naming the problem."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tandem.engine import Engine, EngineConfig, GrammarSpec, RequestError, SamplingParams
from tandem.model import load_model
from tandem.optimize import apply_recipe

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "n", "tags"],
    "additionalProperties": False,
}
JSON = GrammarSpec("json", json.dumps(SCHEMA))
REGEX = GrammarSpec("regex", r"[0-9]{3}-[a-z]{2}")
CHOICE = GrammarSpec("choice", json.dumps(["left", "right"]))
PROMPTS = ["def main():\n", "# config\n", "import os\n", "x = [", "class A:\n", "return "]


def engine(recipe: str = "baseline", **config) -> Engine:
    return Engine(apply_recipe(load_model(), recipe), EngineConfig(max_num_seqs=8, num_threads=1, **config))


@pytest.fixture(scope="module")
def baseline() -> Engine:
    return engine()


def test_each_row_of_a_batch_keeps_to_its_own_grammar_greedy_and_sampled(baseline):
    specs = [JSON, REGEX, CHOICE, None, JSON, REGEX]
    params = [SamplingParams(max_tokens=120, temperature=t, seed=i, grammar=spec)
              for i, spec in enumerate(specs) for t in (0.0, 1.0)]  # fmt: skip
    outs = baseline.generate([p for p in PROMPTS for _ in (0, 1)], params)
    for out, p in zip(outs, params, strict=True):
        if p.grammar is JSON:
            jsonschema.validate(json.loads(out.text), SCHEMA)
        elif p.grammar is REGEX:
            assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", out.text)
        elif p.grammar is CHOICE:
            assert out.text in ("left", "right")
        if p.grammar is not None:
            assert out.finish_reason == "stop"  # the complete grammar ended it, well before max_tokens
            assert len(out.token_ids) < 120


def test_a_complete_grammar_ends_the_sequence_without_more_tokens(baseline):
    (out,) = baseline.generate(["x = "], SamplingParams.greedy_params(50, grammar=GrammarSpec("regex", "abc")))
    assert out.text == "abc" and out.finish_reason == "stop"
    assert 1 not in out.token_ids  # ended by the grammar: no EOS token sampled or reported


@pytest.mark.parametrize("recipe", ["speculative(k=4, max_batch=8)", "ngram(k=4, max_batch=8)"])
def test_speculation_gives_the_same_greedy_output_under_a_grammar(baseline, recipe):
    specs = [JSON, REGEX, CHOICE, JSON, None, JSON]
    params = [SamplingParams.greedy_params(120, grammar=s) for s in specs]
    expected = [o.token_ids for o in baseline.generate(PROMPTS, params)]
    spec_engine = engine(recipe)
    assert [o.token_ids for o in spec_engine.generate(PROMPTS, params)] == expected
    sampled = spec_engine.generate(PROMPTS, [SamplingParams(max_tokens=120, seed=1, grammar=JSON)] * len(PROMPTS))
    for out in sampled:
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_penalties_and_min_tokens_compose_with_the_grammar(baseline):
    penalized = SamplingParams(
        max_tokens=120, temperature=0, repetition_penalty=1.5, frequency_penalty=1.0, grammar=JSON
    )
    (out,) = baseline.generate(["def f():\n"], penalized)
    jsonschema.validate(json.loads(out.text), SCHEMA)
    (plain,) = baseline.generate(["def f():\n"], SamplingParams.greedy_params(120, grammar=JSON))
    assert out.token_ids != plain.token_ids  # the penalties changed the choice among allowed tokens
    # min_tokens bans EOS past the end of a short choice: the grammar wins, and the output stays valid.
    (short,) = baseline.generate(["x"], SamplingParams(max_tokens=20, temperature=0, min_tokens=10, grammar=CHOICE))
    assert short.text in ("left", "right") and short.finish_reason == "stop"


def test_prefix_cached_prompts_get_the_same_constrained_output():
    cached = engine(enable_prefix_caching=True)
    prompt = "def handler(event, context):\n    " * 4
    params = SamplingParams.greedy_params(120, grammar=JSON)
    first = cached.generate([prompt], params)[0]
    second = cached.generate([prompt], params)[0]
    assert second.num_cached_tokens > 0 and second.token_ids == first.token_ids


def test_the_compile_cache_holds_one_grammar_per_spec(baseline):
    spec = GrammarSpec("json", json.dumps({"type": "object", "properties": {"k": {"type": "boolean"}}}))
    before = baseline.grammars.num_compiled
    baseline.check_grammar(spec)
    baseline.generate(PROMPTS[:3], SamplingParams.greedy_params(20, grammar=spec))
    assert baseline.grammars.num_compiled == before + 1


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (GrammarSpec("json", json.dumps({"type": "strin"})), "strin"),
        (GrammarSpec("json", json.dumps({"type": "array", "uniqueItems": True})), "uniqueItems"),
        (GrammarSpec("regex", "(["), "unclosed"),
        (GrammarSpec("grammar", "start: foo"), "foo"),
    ],
)
def test_a_bad_spec_is_a_request_error_naming_the_problem(baseline, spec, named):
    with pytest.raises(RequestError, match=named):
        baseline.add_request("x", SamplingParams(grammar=spec))
    assert not baseline.has_unfinished()
