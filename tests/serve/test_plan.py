"""Planning a request: defaults, context checks, seeds per choice, refusals of unsupported options.
Uses the tiny model's real tokenizer and engine (context 64)."""

from __future__ import annotations

import pytest

from tandem.edge.errors import APIError
from tandem.engine import Engine, EngineConfig
from tandem.model import load_model
from tandem.serve.plan import ModelLimits, plan_chat, plan_completion
from tandem.serve.schemas import ChatCompletionRequest, CompletionRequest

from .conftest import GENERATION_CONFIG


@pytest.fixture(scope="module")
def limits(tiny_llama_dir) -> ModelLimits:
    model = load_model(tiny_llama_dir)
    engine = Engine(model, EngineConfig(max_model_len=64, kv_cache_tokens=256))
    tok = model.tokenizer
    return ModelLimits(
        name="tiny",
        max_model_len=64,
        encode=lambda text, special: tok.encode(text, add_special_tokens=special),
        validate_ids=engine.validate_prompt,
        render_chat=lambda messages: tok.apply_chat_template(messages),
        bos_token=tok.bos_token,
    )


def completion(limits, capacity=8, **fields):
    return plan_completion(CompletionRequest(model="tiny", **fields), limits, max_n=4, capacity=capacity)


def chat(limits, **fields):
    body = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], **fields)
    return plan_chat(body, limits, max_n=4, capacity=8)


def refusal(call, *args, **fields) -> APIError:
    with pytest.raises(APIError) as info:
        call(*args, **fields)
    return info.value


def test_completion_max_tokens_defaults_to_16_and_chat_to_the_rest_of_the_context(limits):
    assert completion(limits, prompt="def add").choices[0].params.max_tokens == 16
    plan = chat(limits)
    assert plan.choices[0].params.max_tokens == 64 - plan.num_prompt_tokens
    assert completion(limits, prompt=[5] * 55).choices[0].params.max_tokens == 64 - 55


def test_the_context_is_checked_with_openai_wording(limits):
    err = refusal(completion, limits, prompt="def add", max_tokens=62)
    assert (err.status, err.param, err.code) == (400, "max_tokens", "context_length_exceeded")
    used = len(limits.encode("def add", True))
    assert "maximum context length is 64 tokens" in err.message and f"({used} in the prompt, 62 for" in err.message
    err = refusal(completion, limits, prompt=[5] * 64)
    assert (err.param, err.code) == ("prompt", "context_length_exceeded")
    err = refusal(chat, limits, max_completion_tokens=64)
    assert err.param == "max_completion_tokens"


def test_choices_are_indexed_per_prompt_and_seeded_apart(limits):
    plan = completion(limits, prompt=["a", "b"], n=2, seed=5, temperature=0.7)
    assert [(c.index, c.prompt_index) for c in plan.choices] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert [c.params.seed for c in plan.choices] == [5, 6, 5, 6]
    assert all(c.params.temperature == 0.7 for c in plan.choices)


def test_requests_that_can_never_fit_are_400_not_429(limits):
    err = refusal(completion, limits, capacity=3, prompt=["a", "b"], n=2)
    assert err.status == 400 and "needs 4 sequences" in err.message and "at most 3" in err.message
    assert refusal(completion, limits, prompt="a", n=5).param == "n"


def test_token_ids_outside_the_vocabulary(limits):
    err = refusal(completion, limits, prompt=[0, 5, 10_000])
    assert err.param == "prompt" and "[0, 320)" in err.message


def test_chat_options(limits):
    plan = chat(limits, logprobs=True, top_logprobs=3, stop="\n")
    assert plan.choices[0].params.logprobs == 3 and plan.choices[0].params.stop == ("\n",)
    assert chat(limits).choices[0].params.logprobs is None
    assert refusal(chat, limits, top_logprobs=2).param == "top_logprobs"
    assert refusal(chat, limits, response_format={"type": "xml"}).param == "response_format"
    assert chat(limits, response_format={"type": "json_object"}).choices[0].params.grammar.kind == "json_object"


def test_a_template_that_writes_bos_gets_no_second_one(limits):
    plain = chat(limits).prompts[0]
    assert plain.count(0) == 1  # the tokenizer adds <s> (id 0) once
    with_bos = ModelLimits(**{**limits.__dict__, "render_chat": lambda m: "<s>" + limits.render_chat(m)})
    body = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert plan_chat(body, with_bos, max_n=4, capacity=8).prompts[0] == plain


def test_unknown_model_is_404(limits):
    err = refusal(plan_completion, CompletionRequest(model="gpt-4", prompt="x"), limits, max_n=4, capacity=8)
    assert (err.status, err.code) == (404, "model_not_found")


def test_a_vanishing_temperature_is_greedy(limits):
    """1e-308 would overflow the logits and fail the whole engine step (found by the fuzz test)."""
    assert completion(limits, prompt="a", temperature=2.2250738585072014e-308).choices[0].params.greedy
    assert completion(limits, prompt="a", temperature=1e-5).choices[0].params.temperature == 1e-5


def test_a_vanishing_top_p_keeps_the_top_token(limits):
    """5e-324 is 0 in float32, where the sampler would keep no token at all (found by the fuzz test)."""
    assert completion(limits, prompt="a", top_p=5e-324).choices[0].params.top_p == 1e-6


def test_vllm_sampling_fields_reach_the_engine(limits):
    plan = completion(
        limits,
        prompt="a",
        max_tokens=12,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.2,
        logit_bias={"7": 2.5, "300": -100},
        min_tokens=3,
        min_p=0.05,
        bad_words=["return"],
        top_k=-1,
        include_stop_str_in_output=True,
    )
    p = plan.choices[0].params
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.25, 1.2)
    assert dict(p.logit_bias) == {7: 2.5, 300: -100} and (p.min_tokens, p.min_p) == (3, 0.05)
    assert p.bad_words == ("return",) and p.top_k == 0 and p.include_stop_str_in_output
    vocab = ModelLimits(**{**limits.__dict__, "vocab_size": 320})
    body = CompletionRequest(model="tiny", prompt="a", logit_bias={"320": 1})
    err = refusal(plan_completion, body, vocab, max_n=4, capacity=8)
    assert err.param == "logit_bias" and "[0, 320)" in err.message
    assert refusal(completion, limits, prompt="a", logit_bias={"-1": 1}).param == "logit_bias"
    assert refusal(completion, limits, prompt="a", max_tokens=2, min_tokens=3).param == "min_tokens"


def test_add_special_tokens_is_obeyed(limits):
    assert completion(limits, prompt="def").prompts[0][0] == 0  # <s>
    assert completion(limits, prompt="def", add_special_tokens=False).prompts[0][0] != 0
    assert chat(limits, add_special_tokens=False).prompts[0].count(0) == 0


def test_omitted_fields_follow_the_generation_config_and_given_ones_win(limits):
    from tandem.model.generation_config import sampling_defaults

    auto = ModelLimits(**{**limits.__dict__, "sampling_defaults": sampling_defaults(GENERATION_CONFIG)})
    p = plan_completion(CompletionRequest(model="tiny", prompt="a"), auto, max_n=4, capacity=8).choices[0].params
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.max_tokens) == (0.6, 0.9, 7, 0.02, 1.3, 9)
    body = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert plan_chat(body, auto, max_n=4, capacity=8).choices[0].params.max_tokens == 9
    given = CompletionRequest(
        model="tiny", prompt="a", temperature=1.0, top_p=1.0, top_k=0, min_p=0, repetition_penalty=1, max_tokens=3
    )
    p = plan_completion(given, auto, max_n=4, capacity=8).choices[0].params
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.max_tokens) == (1.0, 1.0, 0, 0, 1, 3)
    # No defaults (--generation-config vllm): the OpenAI API's.
    p = completion(limits, prompt="a").choices[0].params
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.max_tokens) == (1.0, 1.0, 0, 0, 1, 16)
    greedy = ModelLimits(**{**limits.__dict__, "sampling_defaults": sampling_defaults({"do_sample": False})})
    assert (
        plan_completion(CompletionRequest(model="tiny", prompt="a"), greedy, max_n=4, capacity=8)
        .choices[0]
        .params.greedy
    )
