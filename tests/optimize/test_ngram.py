"""Prompt lookup: the continuation of the latest earlier occurrence of the last n tokens."""

from tandem.optimize.ngram import lookup


def test_longest_suffix_match_wins():
    ids = [1, 2, 3, 9, 9, 2, 3, 7, 8, 1, 2, 3]
    # suffix [1, 2, 3] occurred at 0 -> continuation [9, 9, 2]
    assert lookup(ids, k=3, n_max=3, n_min=1) == [9, 9, 2]


def test_most_recent_occurrence_wins():
    ids = [5, 6, 1, 5, 6, 2, 5, 6]
    assert lookup(ids, k=1, n_max=2, n_min=1) == [2]


def test_falls_back_to_shorter_ngrams_and_to_nothing():
    assert lookup([4, 1, 2, 3, 4], k=2, n_max=3, n_min=1) == [1, 2]
    assert lookup([1, 2, 3], k=2, n_max=3, n_min=1) == []
    assert lookup([7], k=2, n_max=3, n_min=1) == []


def test_continuation_is_capped_by_k_and_sequence_end():
    ids = [1, 2, 3, 4, 5, 1, 2]
    assert lookup(ids, k=10, n_max=2, n_min=2) == [3, 4, 5, 1, 2]
