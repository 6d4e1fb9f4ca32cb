"""Names that fit: short text kept as it is, long text cut to a readable start plus a short hash."""

from __future__ import annotations

import pytest

from tandem.cluster.names import HASH_CHARS, bounded_name, short_hash


def test_a_name_that_fits_is_kept():
    assert bounded_name("int8-ngram", 64) == "int8-ngram"
    assert bounded_name("x" * 64, 64) == "x" * 64


def test_a_long_name_is_its_start_and_a_hash_of_all_of_it():
    long = "speculative-k-4-draft-" + "models-" * 50
    name = bounded_name(long, 64)
    assert len(name) <= 64 and name.startswith("speculative-k-4-draft-models")
    assert name.endswith("-" + short_hash(long)) and len(short_hash(long)) == HASH_CHARS
    assert "--" not in name  # the cut's trailing separators are dropped before the hash
    assert bounded_name(long + "a", 64) != name  # same start, different text: different names
    assert bounded_name(long, 64, source="the recipe") == name[:-HASH_CHARS] + short_hash("the recipe")


def test_a_bound_leaves_room_for_the_hash():
    with pytest.raises(ValueError):
        bounded_name("abc", HASH_CHARS)
