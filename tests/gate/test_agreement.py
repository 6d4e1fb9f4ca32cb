"""Per-pair agreement: teacher-forced over the completion, or over the generations' shared prefix."""

import pytest

from tandem.gate.agreement import TrackMismatch, completion_start, shared_prefix, teacher_forced

from .helpers import track


def test_teacher_forced_compares_top1_and_logprobs_over_the_completion_only():
    tokens = ["def", " f", "():", "\n", "  return", " 1"]
    inc = track(tokens, [None, -1.0, -0.5, -0.1, -0.2, -0.3], [None, " f", "():", "\n", "  return", " 1"])
    cand = track(tokens, [None, -9.0, -9.0, -0.4, -0.2, -1.3], [None, " g", "x", "\n", "  pass", " 1"])
    got = teacher_forced(inc, cand, start=3)
    assert (got.positions, got.agree) == (3, 2)  # the prompt's disagreements do not count
    assert got.gap_positions == 3 and got.gap_sum == pytest.approx(0.3 + 0.0 + 1.0)


def test_teacher_forced_refuses_different_token_sequences():
    with pytest.raises(TrackMismatch):
        teacher_forced(track(["a", "b"]), track(["a", "c"]), 1)


@pytest.mark.parametrize("offsets", [(0, 3, 5, 8, 9, 17), (3, 6, 8, 11, 12, 20), None])
def test_completion_start_from_the_end_of_the_echo(offsets):
    # "def f():" + "\n  return 1": offsets as given, shifted by a "<s>" the server counts, or absent.
    tokens = ["def", " f", "():", "\n", "  return", " 1"]
    text = "def f():\n  return 1"
    assert completion_start(track(tokens, offsets=offsets), text, len("\n  return 1")) == 3


def test_a_token_straddling_the_boundary_counts_as_prompt():
    tokens = ["ab", "cd", "ef"]  # completion "def": "cd" straddles it
    assert completion_start(track(tokens, offsets=(0, 2, 4)), "abcdef", 3) == 2


def test_shared_prefix_stops_at_the_first_differing_token():
    inc = track(["a", "b", "c", "d"], [-0.1, -0.2, -0.3, -0.4])
    cand = track(["a", "b", "x", "y"], [-0.1, -0.4, -0.9, -0.1])
    got = shared_prefix(inc, cand, greedy=True)
    assert (got.positions, got.agree) == (3, 2)  # a, b agree; at the third the two parted
    assert got.gap_positions == 2 and got.gap_sum == pytest.approx(0.2)  # only tokens both wrote


def test_shared_prefix_of_identical_generations_agrees_everywhere():
    same = track(["a", "b"])
    got = shared_prefix(same, same, greedy=True)
    assert (got.positions, got.agree, got.gap_sum) == (2, 2, 0.0)


def test_shared_prefix_uses_top1_not_sampled_tokens():
    # Sampled: both drew "b" though both thought "a" likeliest at the first position.
    inc = track(["b", "c"], top1=["a", "c"])
    cand = track(["b", "c"], top1=["a", "z"])
    got = shared_prefix(inc, cand, greedy=False)
    assert (got.positions, got.agree) == (2, 1)
