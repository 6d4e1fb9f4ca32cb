"""Bearer-token parsing for the API key check."""

from tandem.edge.auth import bearer_token


def test_bearer_token():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None and bearer_token("") is None
