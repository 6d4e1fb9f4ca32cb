"""Bounds on request fields (tandem.serve.bounds): each list, map and long string is refused past its
bound with a 400 naming the field and the bound, before any tokenizing; the model-tied bounds follow
the served model's context (64 tokens here) and vocabulary (320 ids)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tandem.edge.errors import APIError
from tandem.engine import Engine, EngineConfig
from tandem.model import load_model
from tandem.serve.bounds import (
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORD_TOKENS,
    MAX_STOP_STRING_CHARS,
    max_prompt_chars,
    max_request_sequences,
)
from tandem.serve.plan import ModelLimits, plan_chat, plan_completion
from tandem.serve.schemas import ChatCompletionRequest, CompletionRequest

CONTEXT = 64


ENCODED: list[str] = []  # texts the planner tokenized, for "before any work"


@pytest.fixture(scope="module")
def limits(tiny_llama_dir) -> ModelLimits:
    model = load_model(tiny_llama_dir)
    engine = Engine(model, EngineConfig(max_model_len=CONTEXT, kv_cache_tokens=256))
    tok = model.tokenizer

    def encode(text: str, special: bool) -> list[int]:
        ENCODED.append(text)
        return tok.encode(text, add_special_tokens=special)

    return ModelLimits(
        name="tiny",
        max_model_len=CONTEXT,
        encode=encode,
        validate_ids=engine.validate_prompt,
        render_chat=lambda messages: tok.apply_chat_template(messages),
        bos_token=tok.bos_token,
        vocab_size=model.config.vocab_size,
        prepare_tables=engine.processor_tables,
    )


def completion(limits, capacity=272, share=0.25, **fields):
    return plan_completion(CompletionRequest(model="tiny", **fields), limits, max_n=16, capacity=capacity, share=share)


def refusal(limits, **fields) -> APIError:
    ENCODED.clear()
    with pytest.raises(APIError) as info:
        completion(limits, **fields)
    assert not ENCODED, "refused after tokenizing the prompt"
    assert info.value.status == 400
    return info.value


def test_stop_token_ids_are_bounded_by_the_vocabulary(limits):
    vocab = limits.vocab_size
    err = refusal(limits, prompt="a", stop_token_ids=list(range(vocab)) * 2, n=16, min_tokens=5, max_tokens=8)
    assert err.param == "stop_token_ids" and f"at most {vocab} entries" in err.message
    err = refusal(limits, prompt="a", stop_token_ids=[3, vocab])
    assert err.param == "stop_token_ids" and f"[0, {vocab})" in err.message
    plan = completion(limits, prompt="a", stop_token_ids=[5, 5, 3, 5], min_tokens=2, max_tokens=4)
    assert plan.choices[0].params.stop_token_ids == (5, 3)  # duplicates dropped
    # The whole vocabulary is allowed (once): its ban before min_tokens is one precomputed tensor.
    plan = completion(limits, prompt="a", stop_token_ids=list(range(vocab)), min_tokens=2, max_tokens=4, n=4)
    assert int(plan.tables.min_tokens_banned.sum()) == vocab
    assert all(c.params is not None for c in plan.choices) and plan.tables is not None


def test_bad_words_are_bounded_in_count_characters_and_tokens(limits):
    with pytest.raises(ValidationError, match=f"at most {MAX_BAD_WORD_CHARS} characters"):
        CompletionRequest(model="tiny", prompt="a", bad_words=["x" * 3900] * 256)
    with pytest.raises(ValidationError, match="at most 256 items"):
        CompletionRequest(model="tiny", prompt="a", bad_words=["x"] * 257)
    # Within the characters, past the tokens: named with its index.
    long_word = " ".join(f"w{i}" for i in range(100))[:MAX_BAD_WORD_CHARS]
    with pytest.raises(APIError) as info:
        completion(limits, prompt="a", bad_words=["fine", long_word])
    err = info.value
    assert err.param == "bad_words" and "bad_words[1]" in err.message and f"{MAX_BAD_WORD_TOKENS} tokens" in err.message
    # Within the bounds: the choices share one table, built once.
    plan = completion(limits, prompt="a", bad_words=["return", "print(x"], n=3)
    assert plan.tables is not None and len(plan.choices) == 3


def test_stop_strings_are_bounded_in_length():
    with pytest.raises(ValidationError, match=f"at most {MAX_STOP_STRING_CHARS} characters"):
        CompletionRequest(model="tiny", prompt="a", stop=["x" * (MAX_STOP_STRING_CHARS + 1)])
    CompletionRequest(model="tiny", prompt="a", stop=["x" * MAX_STOP_STRING_CHARS])


def test_a_text_that_cannot_fit_in_the_context_is_refused_before_tokenizing(limits):
    limit = max_prompt_chars(CONTEXT)
    err = refusal(limits, prompt="x" * (limit + 1))
    assert (err.param, err.code) == ("prompt", "context_length_exceeded") and str(limit) in err.message
    err = refusal(limits, prompt=["ok", "x" * (limit + 1)])
    assert err.param == "prompt[1]"


def test_chat_messages_are_bounded_in_count_and_text(limits):
    def chat(messages):
        body = ChatCompletionRequest(model="tiny", messages=messages)
        return plan_chat(body, limits, max_n=16, capacity=272, share=0.25)

    with pytest.raises(APIError) as info:
        chat([{"role": "user", "content": "a"}] * (CONTEXT + 1))
    assert info.value.param == "messages" and f"at most {CONTEXT} messages" in info.value.message
    with pytest.raises(APIError) as info:
        chat([{"role": "user", "content": "y" * max_prompt_chars(CONTEXT)}, {"role": "user", "content": "z"}])
    assert (info.value.param, info.value.code) == ("messages", "context_length_exceeded")


def test_one_request_holds_at_most_its_share_of_the_slots_and_queue(limits):
    assert max_request_sequences(272, 0.25) == 68 and max_request_sequences(3, 0.25) == 1
    err = refusal(limits, prompt=["a"] * 20, n=16)  # 320 sequences, 16 slots + 256 queued
    assert err.param == "n" and "needs 320 sequences" in err.message
    assert "at most 68" in err.message and "max_request_share 0.25" in err.message
    assert len(completion(limits, prompt=["a"] * 4, n=16).choices) == 64
    assert len(completion(limits, capacity=8, share=1.0, prompt=["a", "b"], n=4).choices) == 8
