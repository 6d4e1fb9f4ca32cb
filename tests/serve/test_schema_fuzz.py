"""Schema fuzzing against the published OpenAPI document (schemathesis): a real replica, every operation,
valid and invalid requests generated from the document itself; never a 5xx, and every response (its
status, its media type, its body) as the document says."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks
from server_process import ServerProcess

from .conftest import MODEL_NAME, server_args

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]
EXAMPLES = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 25}  # per operation


def served_model(case):
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL_NAME
    return case


@pytest.fixture(scope="module")
def replica(serve_model_dir, tmp_path_factory):
    """A short context, so valid requests are cheap."""
    args = server_args(serve_model_dir, "--max-model-len", "64", "--max-num-seqs", "4", "--max-queue", "64")
    process = ServerProcess(args, tmp_path_factory.mktemp("fuzz") / "server.log")
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(EXAMPLES))
def test_every_response_is_what_the_published_document_says(replica, mode):
    schema = schemathesis.openapi.from_url(replica.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {"POST /v1/completions", "POST /v1/chat/completions", "GET /health"}
    calls: dict[int, int] = {}
    for operation in operations:
        strategy = operation.as_strategy(generation_mode=mode)
        if mode is GenerationMode.POSITIVE:
            strategy = strategy.map(served_model)  # the one name this replica serves, else all were 404s

        @given(case=strategy)
        @settings(max_examples=EXAMPLES[mode], deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case) -> None:
            response = case.call_and_validate(checks=CHECKS, timeout=60)
            calls[response.status_code] = calls.get(response.status_code, 0) + 1

        try:
            fuzz()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # an operation with no input cannot be sent invalid input
    assert not any(status >= 500 for status in calls), calls
    if mode is GenerationMode.POSITIVE:
        assert calls.get(200, 0) >= 10, calls  # valid requests really ran, not only errors
    assert "Traceback" not in replica.log()
