"""Schema fuzzing against the gateway's own OpenAPI document (schemathesis), as tests/serve/test_schema_fuzz.py
does for a replica's: a real gateway in front of one real replica, every operation but one, valid and invalid
requests generated from the document; never a 5xx, and every response (its status, its media type, its
body) as the document says.

`POST /admin/use` is left out: a valid request starts a rollout (new replica processes for whatever recipe
the generator wrote); its refusals are tested in test_admin.py.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode, checks

from .harness import MODEL_NAME, REPLICA_ARGS, RunningGateway

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]
EXAMPLES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 15}  # per operation
LEFT_OUT = {"POST /admin/use"}
# The gateway passes these bodies on unparsed, so its document has no request schema to generate them from:
# valid ones are sent as well, and their responses held to the document.
CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
VALID = {
    "POST /v1/completions": [
        {"model": MODEL_NAME, "prompt": "def add", "max_tokens": 4},
        {"model": MODEL_NAME, "prompt": "def add", "max_tokens": 4, "stream": True},
    ],
    "POST /v1/chat/completions": [CHAT, {**CHAT, "stream": True}],
    "POST /tokenize": [{"model": MODEL_NAME, "prompt": "def add"}],
    "POST /detokenize": [{"model": MODEL_NAME, "tokens": [1, 2, 3]}],
}


def served_model(case):
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL_NAME
    return case


@pytest.fixture(scope="module")
def gateway(serve_model_dir, tmp_path_factory):
    """One replica with a short context, so valid requests are cheap."""
    raw = {
        "model": str(serve_model_dir),
        "threads": 1,
        "variants": [
            {
                "name": "fast",
                "recipe": "baseline",
                "replicas": {"min": 1, "max": 1},
                "args": [*REPLICA_ARGS, "--max-model-len", "64"],
            }
        ],
        "policy": {"name": "hpa", "interval_s": 0.5},
    }
    gw = RunningGateway(raw, tmp_path_factory.mktemp("gateway-fuzz"))
    try:
        gw.wait_ready("fast")
        yield gw
    finally:
        gw.stop()


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(EXAMPLES))
def test_every_gateway_response_is_what_its_published_document_says(gateway, mode):
    schema = schemathesis.openapi.from_url(gateway.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {op.label for op in operations}
    assert labels >= {"POST /v1/completions", "POST /v1/chat/completions", "GET /admin/replicas", *LEFT_OUT}
    calls: dict[int, int] = {}
    ok: dict[str, int] = {}  # 200s by operation
    for operation in operations:
        if operation.label in LEFT_OUT:
            continue
        strategy = operation.as_strategy(generation_mode=mode)
        if mode is GenerationMode.POSITIVE:
            strategy = strategy.map(served_model)  # the one name the fleet serves, else all were 404s

        @given(case=strategy)
        @settings(max_examples=EXAMPLES[mode], deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case) -> None:
            response = case.call_and_validate(checks=CHECKS, timeout=60)
            calls[response.status_code] = calls.get(response.status_code, 0) + 1
            if response.status_code == 200:
                ok[case.operation.label] = ok.get(case.operation.label, 0) + 1

        try:
            fuzz()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE  # an operation with no input cannot be sent invalid input
        if mode is GenerationMode.POSITIVE:
            for body in VALID.get(operation.label, []):
                case = operation.Case(body=body, media_type="application/json")
                response = case.call_and_validate(checks=CHECKS, timeout=60)
                assert response.status_code == 200, (operation.label, response.text)
                ok[operation.label] = ok.get(operation.label, 0) + 1
    assert not any(status >= 500 for status in calls), calls
    if mode is GenerationMode.POSITIVE:  # valid requests really ran, not only errors
        answered = {"GET /health", "GET /ready", "GET /metrics", "GET /v1/models", "GET /version"}
        assert answered | {"GET /admin/replicas", "GET /admin/rollout", *VALID} <= set(ok), (ok, calls)
    assert gateway.errors() == 0 and "Traceback" not in gateway.logs()
