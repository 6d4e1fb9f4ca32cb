"""The official openai client against a real `tandem serve`: completions, chat, streaming, usage, n, stop,
seed, logprobs, token-id and batched prompts, and concurrent greedy requests matching solo ones."""

from __future__ import annotations

import asyncio

import openai
import pytest

from .conftest import MODEL_NAME

GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_served_model(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_completion_reports_text_usage_and_finish_reason(client, tokenizer):
    out = client.completions.create(model=MODEL_NAME, prompt="def add(a, b):", max_tokens=8, **GREEDY)
    assert out.object == "text_completion" and out.model == MODEL_NAME and out.id.startswith("cmpl-")
    (choice,) = out.choices
    assert choice.index == 0 and choice.finish_reason == "length" and isinstance(choice.text, str)
    assert out.usage.prompt_tokens == len(tokenizer.encode("def add(a, b):"))
    assert out.usage.completion_tokens == 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8


def test_streamed_completion_equals_the_whole_one_and_ends_with_usage(client):
    args = dict(model=MODEL_NAME, prompt="class Point:", max_tokens=20, **GREEDY)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_chat_completion_uses_the_chat_template(client, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    out = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6, **GREEDY)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    (choice,) = out.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    rendered = "<|system|>\nBe brief.\n<|user|>\nSay hi\n<|assistant|>\n"  # tests/tiny_models.py CHAT_TEMPLATE
    assert out.usage.prompt_tokens == len(tokenizer.encode(rendered))
    assert out.usage.completion_tokens == 6


def test_streamed_chat_starts_with_the_role_and_matches_the_whole_answer(client):
    args = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "def f(x):"}], max_tokens=16, **GREEDY)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 16 and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_n_choices_with_a_seed_are_reproducible_and_distinct(client):
    args = dict(model=MODEL_NAME, prompt="import os", max_tokens=12, n=3, temperature=1.0, seed=7)
    first = client.completions.create(**args)
    second = client.completions.create(**args)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert len({c.text for c in first.choices}) > 1  # each choice samples its own way


def test_stop_string_ends_the_text_before_it(client):
    args = dict(model=MODEL_NAME, prompt="for i in range(10):", max_tokens=24, **GREEDY)
    text = client.completions.create(**args).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert len(stop) == 2, text
    out = client.completions.create(stop=[stop], **args).choices[0]
    assert out.text == text[: text.find(stop)] and out.finish_reason == "stop"


def test_completion_logprobs(client):
    out = client.completions.create(model=MODEL_NAME, prompt="x = 1", max_tokens=5, logprobs=3, **GREEDY)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    for logprob, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0 and 1 <= len(top) <= 3
        assert logprob == pytest.approx(max(top.values()), abs=1e-6)  # greedy takes the most likely token
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs(client):
    out = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        **GREEDY,
    )
    content = out.choices[0].logprobs.content
    assert len(content) == 4
    for item in content:
        assert len(item.top_logprobs) == 2 and item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob, abs=1e-6)


def test_token_id_prompt_and_batched_prompts(client, tokenizer):
    ids = tokenizer.encode("def add")
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=6, **GREEDY)
    by_text = client.completions.create(model=MODEL_NAME, prompt="def add", max_tokens=6, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model=MODEL_NAME, prompt=["def add", "class A"], n=2, max_tokens=6, **GREEDY)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text == by_text.choices[0].text  # greedy: n copies agree
    assert batch.usage.prompt_tokens == len(ids) + len(tokenizer.encode("class A"))
    assert batch.usage.completion_tokens == 4 * 6


PROMPTS = ["def add(a, b):", "class Point:", "import os\n", "for i in range(3):", "The quick brown", "x = [", "#", "ab"]


def test_concurrent_greedy_requests_return_what_each_returns_alone(server):
    """Batched decoding must not change greedy output: solo answers == answers under concurrency."""
    aclient_args = dict(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    async def one(aclient: openai.AsyncOpenAI, prompt: str, stream: bool) -> str:
        args = dict(model=MODEL_NAME, prompt=prompt, max_tokens=24, **GREEDY)
        if not stream:
            return (await aclient.completions.create(**args)).choices[0].text
        return "".join([c.choices[0].text async for c in await aclient.completions.create(stream=True, **args)])

    async def main() -> tuple[list[str], list[str]]:
        async with openai.AsyncOpenAI(**aclient_args) as aclient:
            alone = [await one(aclient, p, stream=False) for p in PROMPTS]
            together = await asyncio.gather(*(one(aclient, p, stream=i % 2 == 0) for i, p in enumerate(PROMPTS)))
            return alone, list(together)

    alone, together = asyncio.run(main())
    assert together == alone


# -- echo: teacher-forced scoring of a text (the validation gate's accuracy check) --------------------

SCORED = "def add(a, b):\n    return a + b\n"


def transformers_logprobs(model_dir, ids):
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_echo_with_max_tokens_zero_scores_every_prompt_token(client, tokenizer, serve_model_dir):
    out = client.completions.create(model=MODEL_NAME, prompt=SCORED, max_tokens=0, echo=True, logprobs=2)
    (choice,) = out.choices
    ids = tokenizer.encode(SCORED)
    assert choice.text == SCORED and choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp.tokens == [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    reference = transformers_logprobs(serve_model_dir, ids)
    expected = [float(reference[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    for i, top in enumerate(lp.top_logprobs[1:], start=1):
        assert len(top) <= 2 and max(top.values()) == pytest.approx(float(reference[i - 1].max()), abs=1e-4)
    # Offsets point into the returned text: the tokenizer's "<s>" (not in the text) takes no room.
    assert lp.tokens[0] == "<s>" and lp.text_offset[:2] == [0, 0]
    for token, offset in zip(lp.tokens[1:], lp.text_offset[1:], strict=True):
        assert choice.text[offset : offset + len(token)] == token
    assert lp.text_offset[-1] + len(lp.tokens[-1]) == len(choice.text)


def test_echo_with_a_completion_returns_the_prompt_then_the_completion(client, tokenizer):
    args = dict(model=MODEL_NAME, prompt="class Point:", max_tokens=6, logprobs=1, **GREEDY)
    plain = client.completions.create(**args).choices[0]
    echoed = client.completions.create(echo=True, **args).choices[0]
    prompt_ids = tokenizer.encode("class Point:")
    assert echoed.text == "class Point:" + plain.text
    lp = echoed.logprobs
    assert len(lp.tokens) == len(prompt_ids) + 6 and lp.token_logprobs[0] is None
    assert lp.tokens[len(prompt_ids) :] == plain.logprobs.tokens
    assert lp.token_logprobs[len(prompt_ids) :] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-5)
    assert lp.text_offset[len(prompt_ids)] == len("class Point:")  # the completion starts after the prompt's text
    # Streamed, the first chunk echoes the prompt (with its logprobs); the text and tokens add up.
    chunks = list(client.completions.create(echo=True, stream=True, **args))
    assert chunks[0].choices[0].text.startswith("class Point:")
    assert "".join(c.choices[0].text for c in chunks) == echoed.text
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == lp.tokens
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset


def test_echo_of_a_token_id_prompt_and_without_logprobs(client, tokenizer):
    ids = tokenizer.encode("import os")
    out = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=0, echo=True)
    assert out.choices[0].text == tokenizer.decode(ids) and out.choices[0].logprobs is None
    # The prompt was computed (and cached) by the requests above: a repeated scoring request must
    # still compute every position, so its logprobs match a fresh one's.
    first = client.completions.create(model=MODEL_NAME, prompt=SCORED, max_tokens=0, echo=True, logprobs=0)
    again = client.completions.create(model=MODEL_NAME, prompt=SCORED, max_tokens=0, echo=True, logprobs=0)
    assert again.choices[0].logprobs.token_logprobs == first.choices[0].logprobs.token_logprobs


def test_vllm_sampling_parameters_give_what_the_engine_gives(client, serve_model_dir):
    from tandem.engine import Engine, EngineConfig, SamplingParams
    from tandem.model import load_model

    prompt = "def add(a, b):"
    extra = {"repetition_penalty": 1.4, "min_tokens": 10, "bad_words": ["return"], "min_p": 0.1}
    out = client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=14,
        temperature=0,
        presence_penalty=0.4,
        frequency_penalty=0.3,
        logit_bias={"7": 5, "1": 20},  # EOS (1) favoured, held back by min_tokens
        extra_body=extra,
    )
    params = SamplingParams.greedy_params(
        14, presence_penalty=0.4, frequency_penalty=0.3, logit_bias={7: 5, 1: 20}, **extra
    )
    engine = Engine(load_model(serve_model_dir), EngineConfig(max_model_len=256, kv_cache_tokens=256, num_threads=1))
    (expected,) = engine.generate([prompt], params)
    assert out.choices[0].text == expected.text and out.usage.completion_tokens == len(expected.token_ids) == 11
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0,
        extra_body={"repetition_penalty": 1.4, "ignore_eos": True},
    )  # fmt: skip
    assert chat.choices[0].finish_reason == "length"


def test_a_parameter_tandem_lacks_is_refused_by_name(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="x", extra_body={"use_beam_search": True})
    assert info.value.body["param"] == "use_beam_search"
