"""Admission: sequences fit in slots + queue, else 429 with Retry-After; nothing while draining (503)."""

from __future__ import annotations

import pytest

from tandem.edge.errors import APIError
from tandem.serve.admission import Admission


def test_admits_up_to_capacity_then_429_with_retry_after():
    admission = Admission(capacity=3, retry_after_s=2)
    first = admission.admit(2)
    admission.admit(1)
    with pytest.raises(APIError) as info:
        admission.admit(1)
    assert info.value.status == 429 and info.value.headers == {"Retry-After": "2"}
    assert "3 sequences running or queued" in info.value.message
    first.release()
    first.release()  # idempotent: a stream can end two ways at once
    assert admission.in_flight == 1
    admission.admit(2)


def test_draining_refuses_everything():
    admission = Admission(capacity=10)
    admission.draining = True
    with pytest.raises(APIError) as info:
        admission.admit(1)
    assert info.value.status == 503 and info.value.code == "shutting_down"
