"""Validation errors become one OpenAI-style message naming the field."""

from tandem.edge.errors import error_body, validation_message


def test_field_paths_drop_body_and_union_members():
    errors = [{"type": "string_type", "loc": ("body", "messages", 0, "content", "str"), "msg": "Input should be"}]
    assert validation_message(errors) == (
        "messages[0].content: Input should be",
        "messages[0].content",
        "invalid_value",
    )


def test_kinds():
    assert validation_message([{"type": "missing", "loc": ("body", "model"), "msg": "x"}])[0] == (
        "model: this field is required"
    )
    assert validation_message([{"type": "json_invalid", "loc": ("body", 3), "msg": "x"}])[2] == "invalid_json"
    assert validation_message([{"type": "model_attributes_type", "loc": ("body",), "msg": "x"}])[0] == (
        "the request body must be a JSON object"
    )
    assert validation_message([{"type": "value_error", "loc": ("body", "stop"), "msg": "Value error, bad"}])[0] == (
        "stop: bad"
    )


def test_error_body_shape():
    assert error_body(429, "busy", code="queue_full") == {
        "error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": "queue_full"}
    }


def test_one_spelling_of_type_per_class_of_status():
    types = {status: error_body(status, "m")["error"]["type"] for status in (400, 401, 404, 413, 429, 500, 502, 503)}
    assert types == {
        400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
        413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 502: "server_error",
        503: "server_error",
    }  # fmt: skip
