"""A request's priority on a replica: vLLM's `priority` field, unless its gateway sent the tenant's."""

import pytest
from pydantic import ValidationError

from tandem.contracts import PRIORITY_HEADER
from tandem.serve.priority import request_priority
from tandem.serve.schemas import CompletionRequest


def test_the_gateways_header_wins_over_the_clients_field():
    assert request_priority({}, 5) == 5
    assert request_priority({PRIORITY_HEADER: "-1"}, 5) == -1
    assert request_priority({PRIORITY_HEADER: "junk"}, 5) == 5
    assert request_priority({PRIORITY_HEADER: str(10**12)}, 0) == 2**31 - 1


def test_the_field_is_an_integer_as_vllms():
    assert CompletionRequest(model="m", prompt="x", priority=-3).priority == -3
    assert CompletionRequest(model="m", prompt="x").priority == 0
    with pytest.raises(ValidationError):
        CompletionRequest(model="m", prompt="x", priority="high")
