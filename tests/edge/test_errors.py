"""Validation errors become one OpenAI-style message naming the field."""

import json

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


def test_an_unexpected_error_is_a_500_body_and_the_keep_alive_connection_survives():
    """Starlette re-raises after its handler for Exception, and uvicorn then drops the connection; here
    the client's next request on the same connection must succeed (a real uvicorn, real sockets)."""
    import threading

    import httpx
    import uvicorn
    from fastapi import FastAPI
    from server_process import free_port

    from tandem.edge.errors import install_error_handlers
    from tandem.edge.server import uvicorn_config
    from tandem.edge.settings import Settings

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("a bug")

    @app.get("/ok")
    async def ok() -> dict:
        return {"ok": True}

    server = uvicorn.Server(uvicorn_config(app, Settings(port=free_port(), log_level="error"), shutdown_timeout_s=1))
    server.install_signal_handlers = lambda: None
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            threading.Event().wait(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            local_ports = set()
            for path in ["/boom", "/ok"] * 5:
                r = client.get(path)
                local_ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
                if path == "/boom":
                    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
                    assert "a bug" not in r.text and r.headers.get("connection") != "close"
                else:
                    assert r.status_code == 200
        assert len(local_ports) == 1  # one connection throughout
    finally:
        server.should_exit = True
        thread.join(10)


def test_error_bodies_always_encode():
    from tandem.edge.errors import APIError, error_response

    response = error_response(APIError(404, "the model 'x\ud800' does not exist"))
    assert json.loads(response.body)["error"]["message"] == "the model 'x\ud800' does not exist"


def test_an_empty_body_is_named_as_such():
    message, param, code = validation_message([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    assert (message, param, code) == ("the request body is empty; send a JSON object", None, "missing_body")
