"""Both wire formats of per-token logprobs read into one TokenTrack."""

from tandem.measure.logprobs import TokenTrack, parse_logprobs


def test_legacy_completions_echo_shape_with_null_first_position():
    # As vLLM answers `echo: true, logprobs: 1, max_tokens: 0`: the first token has no logprob.
    raw = {
        "tokens": ["def", " f", "():"],
        "token_logprobs": [None, -1.5, -0.25],
        "top_logprobs": [None, {" f": -1.5, " g": -1.0}, {"():": -0.25}],
        "text_offset": [0, 3, 5],
    }
    track = parse_logprobs(raw)
    assert track == TokenTrack(("def", " f", "():"), (None, -1.5, -0.25), (None, " g", "():"), (0, 3, 5))


def test_chat_shape():
    raw = {"content": [
        {"token": "a", "logprob": -0.1,
         "top_logprobs": [{"token": "b", "logprob": -0.05}, {"token": "a", "logprob": -0.1}]},
        {"token": "c", "logprob": -2.0, "top_logprobs": []},
    ]}  # fmt: skip
    track = parse_logprobs(raw)
    assert track.tokens == ("a", "c") and track.logprobs == (-0.1, -2.0) and track.top1 == ("b", None)
    assert track.offsets is None


def test_missing_or_malformed_logprobs_are_none():
    assert parse_logprobs(None) is None
    assert parse_logprobs({"tokens": [1, 2]}) is None
    assert parse_logprobs({"tokens": ["a"], "token_logprobs": [-1, -2]}) is None  # lengths disagree


def test_bad_numbers_and_offsets_are_dropped_not_trusted():
    track = parse_logprobs({"tokens": ["a"], "token_logprobs": [float("nan")], "top_logprobs": [{"a": True}],
                            "text_offset": ["0"]})  # fmt: skip
    assert track.logprobs == (None,) and track.top1 == (None,) and track.offsets is None


def test_concat_and_json_round_trip():
    a = parse_logprobs({"tokens": ["x"], "token_logprobs": [-1.0], "top_logprobs": [{"x": -1.0}], "text_offset": [0]})
    b = parse_logprobs({"tokens": ["y"], "token_logprobs": [-2.0], "top_logprobs": [{"y": -2.0}], "text_offset": [1]})
    joined = TokenTrack.concat([a, b])
    assert joined.tokens == ("x", "y") and joined.offsets == (0, 1)
    assert TokenTrack.from_dict(joined.to_dict()) == joined
