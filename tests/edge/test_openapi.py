"""The published documents list what the servers answer: the 200 body (JSON, and text/event-stream where
the route streams), every error status with the one error body, text/plain for /metrics, no unused 422."""

from __future__ import annotations

import httpx

from tandem.edge.settings import Settings


def responses(doc: dict, path: str, method: str) -> dict:
    return doc["paths"][path][method]["responses"]


def test_the_replica_documents_errors_and_streams():
    from tandem.serve import create_app

    doc = create_app(Settings(), lambda: None).openapi()
    for path in ("/v1/completions", "/v1/chat/completions"):
        answers = responses(doc, path, "post")
        assert set(answers["200"]["content"]) == {"application/json", "text/event-stream"}
        assert answers["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
            "Completion" if path == "/v1/completions" else "ChatCompletion"
        )
        assert {"400", "401", "404", "408", "413", "429", "500", "503"} <= set(answers) and "422" not in answers
        assert answers["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert set(responses(doc, "/metrics", "get")["200"]["content"]) == {"text/plain"}
    assert "503" in responses(doc, "/ready", "get")
    schemas = doc["components"]["schemas"]
    assert set(schemas["ErrorDetail"]["properties"]) == {"message", "type", "param", "code"}
    assert "HTTPValidationError" not in schemas


def test_the_gateway_documents_errors_and_streams():
    from tandem.cluster.fake import FakeBackend
    from tandem.deployment import parse_deployment
    from tandem.gateway.app import create_gateway_app
    from tandem.gateway.wiring import build_gateway

    deployment = parse_deployment({"variants": [{"name": "v", "recipe": "baseline"}], "policy": {"name": "hpa"}})
    transport = httpx.MockTransport(lambda r: httpx.Response(200))
    gw = build_gateway(deployment, FakeBackend(clock=lambda: 0.0), transport=transport)
    doc = create_gateway_app(gw).openapi()
    answers = responses(doc, "/v1/completions", "post")
    assert set(answers["200"]["content"]) == {"application/json", "text/event-stream"}
    assert {"400", "413", "503"} <= set(answers) and "422" not in answers
