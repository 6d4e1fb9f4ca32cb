"""Tool plans, the hermes parser, streamed tool-call deltas, and closing object schemas: pure functions."""

from __future__ import annotations

import json

import pytest

from tandem.edge.errors import APIError
from tandem.serve.structured import closed_objects
from tandem.serve.tools import ToolCallStream, ToolPlan, hermes_text, parse_tool_calls, plan_tools

TOOLS = [
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {}}}}},
    {"type": "function", "function": {"name": "b"}},
]


def test_required_constrains_to_an_array_of_calls_and_named_to_the_arguments():
    plan, (param, spec) = plan_tools(TOOLS, "required", False, None)
    schema = json.loads(spec.value)
    assert plan == ToolPlan("required") and param == "tools"
    assert schema["minItems"] == 1 and schema["maxItems"] == 1  # parallel_tool_calls false
    assert [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]] == ["a", "b"]
    plan, (_, spec) = plan_tools(TOOLS, {"type": "function", "function": {"name": "a"}}, True, None)
    assert plan == ToolPlan("named", function="a")
    assert json.loads(spec.value) == {"type": "object", "properties": {"x": {}}, "additionalProperties": False}


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        (TOOLS, {"type": "function", "function": {"name": "zz"}}, "tool_choice"),
        (None, "required", "tool_choice"),
        (TOOLS, "sometimes", "tool_choice"),
        ([{"type": "code_interpreter"}], "required", "tools[0]"),
        ([{"type": "function", "function": {"name": "bad name"}}], "required", "tools[0]"),
        (TOOLS + TOOLS[:1], "required", "tools[2]"),
    ],
)
def test_bad_tool_requests_name_the_field(tools, choice, param):
    with pytest.raises(APIError) as caught:
        plan_tools(tools, choice, True, "hermes")
    assert caught.value.param == param


def test_none_and_no_tools_plan_nothing():
    assert plan_tools(TOOLS, "none", True, None) == (None, None)
    assert plan_tools(None, None, True, None) == (None, None)
    assert plan_tools(TOOLS, "auto", True, "hermes") == (ToolPlan("auto", parser="hermes"), None)


def test_hermes_blocks_become_calls_and_the_rest_stays_content():
    text = (
        'Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "b"}</tool_call>'
    )
    content, calls = parse_tool_calls(ToolPlan("auto", parser="hermes"), text)
    assert content == "Let me look."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("a", {"x": 1}),
        ("b", {}),
    ]
    assert parse_tool_calls(ToolPlan("auto"), "no calls <tool_call>{bad</tool_call>") == (
        "no calls <tool_call>{bad</tool_call>",
        [],
    )
    assert parse_tool_calls(ToolPlan("required"), '[{"name": "a", "arguments": {"x"') == (
        '[{"name": "a", "arguments": {"x"',
        [],
    )


def test_hermes_text_writes_calls_the_parser_reads_back():
    calls = [{"type": "function", "function": {"name": "a", "arguments": '{"x": 2}'}}]
    _, parsed = parse_tool_calls(ToolPlan("auto"), hermes_text(calls))
    assert parsed[0]["function"]["name"] == "a" and json.loads(parsed[0]["function"]["arguments"]) == {"x": 2}


def test_a_named_stream_sends_the_header_then_argument_pieces():
    stream = ToolCallStream(ToolPlan("named", function="a"))
    first = stream.deltas('{"x"', False)
    assert first[0]["tool_calls"][0]["function"] == {"name": "a", "arguments": ""}
    assert first[0]["tool_calls"][0]["id"].startswith("call_")
    assert first[1] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"x"'}}]}
    assert stream.deltas(":1}", True) == [{"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}]
    assert stream.finish_reason("stop") == "tool_calls" and stream.finish_reason("length") == "length"


def test_a_required_stream_sends_each_call_once_complete():
    stream = ToolCallStream(ToolPlan("required"))
    assert stream.deltas('[{"name":"a",', False) == []
    deltas = stream.deltas('"arguments":{"x":1}},{"name":"b","arguments":{}}]', True)
    assert [d["tool_calls"][0]["index"] for d in deltas] == [0, 1]
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas] == ["a", "b"]


def test_closing_objects_keeps_explicit_choices():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {}}},
            "c": {"type": "array", "items": {"properties": {}}},
        },
        "$defs": {"d": {"properties": {}, "additionalProperties": True}},
        "anyOf": [{"properties": {}}],
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert closed["properties"]["c"]["items"]["additionalProperties"] is False
    assert closed["$defs"]["d"]["additionalProperties"] is True
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's schema is not changed


def test_an_auto_stream_sends_text_as_content_until_a_call_begins():
    stream = ToolCallStream(ToolPlan("auto", parser="hermes"))
    assert stream.deltas("Let me look", False) == [{"content": "Let me look"}]
    assert stream.deltas(". <tool", False) == [{"content": ". "}]  # "<tool" may begin a tag: held
    assert stream.deltas('_call>{"name": "a", "arguments": {"x": 1}}</tool_call>', False) == []
    (call,) = stream.deltas("", True)
    assert call["tool_calls"][0]["function"]["name"] == "a" and stream.finish_reason("stop") == "tool_calls"
    plain = ToolCallStream(ToolPlan("auto", parser="hermes"))
    assert plain.deltas("a <", False) == [{"content": "a "}]
    assert plain.deltas(" b", True) == [{"content": "< b"}] and plain.finish_reason("stop") == "stop"
