"""Response bodies: logprob shapes for both APIs, usage, finish reasons, usage chunks."""

from __future__ import annotations

from tandem.engine import TokenLogprob
from tandem.serve import responses as R

TEXT = {1: "a", 2: "bc", 3: "a", 4: "d"}.__getitem__


def test_completion_logprobs_offsets_and_colliding_texts():
    entries = [TokenLogprob(2, -0.5, {2: -0.5, 1: -1.0, 3: -0.7}), TokenLogprob(4, -0.1, {})]
    out = R.completion_logprobs(entries, TEXT, text_offset=10)
    assert out["tokens"] == ["bc", "d"] and out["token_logprobs"] == [-0.5, -0.1]
    assert out["text_offset"] == [10, 12]
    # ids 1 and 3 both read "a": the likelier one is kept
    assert out["top_logprobs"] == [{"bc": -0.5, "a": -0.7}, {}]


def test_echo_logprobs_start_with_the_prompt_whose_first_token_has_none():
    prompt = [None, TokenLogprob(1, -2.0, {3: -0.2})]
    out = R.echo_logprobs([2, 1], prompt, [TokenLogprob(4, -0.1, {4: -0.1})], TEXT, "bca")
    assert out["tokens"] == ["bc", "a", "d"] and out["text_offset"] == [0, 2, 3]
    assert out["token_logprobs"] == [None, -2.0, -0.1]
    assert out["top_logprobs"] == [None, {"a": -0.2}, {"d": -0.1}]


def test_echo_offsets_point_into_the_returned_text_past_a_token_it_lacks():
    text = {0: "<s>", 1: "ab", 2: "c", 3: "d"}.__getitem__
    out = R.echo_logprobs([0, 1, 2], [None, None, None], [TokenLogprob(3, -0.1, {})], text, "abc")
    assert out["tokens"] == ["<s>", "ab", "c", "d"]
    assert out["text_offset"] == [0, 0, 2, 3]  # "<s>" is not in "abc" + "d": it takes no room


def test_chat_logprobs_rank_alternatives_and_carry_bytes():
    (item,) = R.chat_logprobs([TokenLogprob(1, -0.2, {4: -2.0, 1: -0.2})], TEXT)["content"]
    assert item["token"] == "a" and item["bytes"] == [97] and item["logprob"] == -0.2
    assert [t["token"] for t in item["top_logprobs"]] == ["a", "d"]


def test_usage_and_bodies():
    assert R.usage(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    body = R.chat_body("id", 1, "m", [R.chat_choice(0, "hi", "stop", None)], R.usage(1, 1))
    assert body["object"] == "chat.completion" and body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "hi",
    }
    chunk = R.usage_chunk("id", "chat.completion.chunk", 1, "m", R.usage(1, 2))
    assert chunk["choices"] == [] and chunk["usage"]["total_tokens"] == 3


def test_finish_reasons():
    assert R.api_finish_reason("stop") == "stop" and R.api_finish_reason(None) is None
    assert R.api_finish_reason("abort") == "length"  # cut short: OpenAI has no "abort"
    chunk = R.completion_chunk("id", 1, "m", 2, "x", "length", None)
    assert chunk["choices"][0]["index"] == 2 and chunk["choices"][0]["finish_reason"] == "length"
