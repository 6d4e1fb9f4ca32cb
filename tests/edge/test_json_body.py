"""Request bodies parsed once at the edge: bad UTF-8, bad JSON, deep nesting and lone surrogates are 400s."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from tandem.edge.errors import APIError
from tandem.edge.json_body import MAX_JSON_DEPTH, OFF_LOOP_BYTES, parse_json_body, parse_json_body_async


def refused(raw: bytes) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_json_body(raw)
    assert caught.value.status == 400
    return caught.value


def test_a_lone_surrogate_is_refused_naming_the_field():
    error = refused(b'{"model": "m", "prompt": "hi \\ud800 there"}')
    assert error.param == "prompt" and error.code == "invalid_unicode" and "surrogate" in error.message
    chat = refused(b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\uDFFF"}]}]}')
    assert chat.param == "messages[0].content[0].text"
    assert refused(b'{"\\ud83d": 1}').code == "invalid_unicode"  # in a key
    assert refused(b'"\\udc00"').param is None  # the body itself


def test_surrogate_pairs_and_escaped_backslashes_are_fine():
    assert parse_json_body(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}
    assert parse_json_body(b'{"prompt": "\\\\ud800"}') == {"prompt": "\\ud800"}  # a backslash, then text


def test_nesting_is_bounded_whatever_the_depth():
    ok = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert parse_json_body(ok) is not None
    for depth in (MAX_JSON_DEPTH + 1, 5_000, 100_000):
        error = refused(b"[" * depth + b"]" * depth)
        assert error.code == "json_too_deep" and str(MAX_JSON_DEPTH) in error.message
    wide = json.dumps({"prompt": [[1, 2, 3]] * 5000}).encode()  # many brackets, shallow: parsed
    assert len(parse_json_body(wide)["prompt"]) == 5000


def test_bad_utf8_and_bad_json_name_the_problem():
    assert "UTF-8" in refused(b'{"a": "\xff"}').message
    assert refused(b"{not json").code == "invalid_json"
    assert refused(b'{"n": ' + b"9" * 5000 + b"}").code == "invalid_json"  # past Python's digit limit


def test_large_bodies_are_parsed_off_the_event_loop():
    body = json.dumps({"prompt": "x" * (OFF_LOOP_BYTES * 2)}).encode()
    threads: list[str] = []

    async def main() -> None:
        import tandem.edge.json_body as module

        real = module.parse_json_body

        def spy(raw: bytes):
            threads.append(threading.current_thread().name)
            return real(raw)

        module.parse_json_body = spy
        try:
            await parse_json_body_async(body)
            await parse_json_body_async(b"{}")
        finally:
            module.parse_json_body = real

    asyncio.run(main())
    assert threads[0] != threading.main_thread().name and threads[1] == threading.main_thread().name
