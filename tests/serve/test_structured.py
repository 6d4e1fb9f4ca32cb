"""Structured output and tool calls through real `tandem serve` processes on the bundled model, with
the official openai client: 20 JSON schemas (greedy and sampled) under baseline, int8 and a
speculative recipe; greedy identity between baseline+speculative and baseline; regex, choice,
json_object, vLLM's fields; tools (required, named, auto with the hermes parser; streamed and not);
a tool message through the template; 400s naming an invalid schema, a tool and a keyword."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from server_process import ServerProcess

from tandem.edge.errors import APIError
from tandem.serve.tools import plan_tools

from .json_schemas import SCHEMAS

RECIPES = {"baseline": "baseline", "int8": "int8", "speculative": "speculative(k=4)"}
MODEL = "bundled"
MESSAGES = [{"role": "user", "content": "Give the answer as JSON."}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("structured-logs")
    started = {
        name: ServerProcess(
            [
                "--recipe",
                recipe,
                "--served-model-name",
                MODEL,
                "--threads",
                "1",
                "--max-num-seqs",
                "16",
                "--tool-call-parser",
                "hermes",
            ],
            logs / f"{name}.log",
        )  # fmt: skip
        for name, recipe in RECIPES.items()
    }
    try:
        yield {name: server.wait_ready(240) for name, server in started.items()}
    finally:
        for server in started.values():
            server.stop()


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(servers) -> openai.OpenAI:
    return _client(servers["baseline"])


def _schema_answers(client: openai.OpenAI, temperature: float, workers: int = 1) -> list[str]:
    """The answer to each schema; `workers` requests at once (1: one after another)."""

    def one(i: int) -> str:
        answer = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=200,
            temperature=temperature,
            seed=i,
            response_format={
                "type": "json_schema", "json_schema": {"name": f"s{i}", "schema": SCHEMAS[i], "strict": True},
            },
        )  # fmt: skip
        (choice,) = answer.choices
        assert choice.finish_reason == "stop", (i, choice.message.content)
        return choice.message.content

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, range(len(SCHEMAS))))


@pytest.fixture(scope="module")
def greedy(servers) -> Callable[[str], list[str]]:
    """A recipe's greedy answers, asked once and shared by the tests below; one request at a time, so
    the speculation test compares outputs that no batch composition touched."""
    answers: dict[str, list[str]] = {}

    def of(recipe: str) -> list[str]:
        if recipe not in answers:
            answers[recipe] = _schema_answers(_client(servers[recipe]), 0.0)
        return answers[recipe]

    return of


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_twenty_schemas_hold_greedy_and_sampled_under_every_recipe(servers, greedy, recipe):
    sampled = _schema_answers(_client(servers[recipe]), 1.0, workers=4)  # batched, as a server's traffic is
    for answers in (greedy(recipe), sampled):
        for schema, text in zip(SCHEMAS, answers, strict=True):
            jsonschema.validate(json.loads(text), schema)


def test_speculation_gives_baselines_greedy_output_under_each_schema(greedy):
    assert greedy("speculative") == greedy("baseline")


def test_regex_choice_and_json_object_constraints_hold(client):
    def complete(**extra) -> str:
        out = client.completions.create(model=MODEL, prompt="x = ", max_tokens=60, temperature=1.0, seed=3, **extra)
        return out.choices[0].text

    import re

    assert re.fullmatch(
        r"[a-f0-9]{4}-[0-9]{2}", complete(extra_body={"structured_outputs": {"regex": r"[a-f0-9]{4}-[0-9]{2}"}})
    )
    assert re.fullmatch(r"(true|false)", complete(extra_body={"guided_regex": "(true|false)"}))
    assert complete(extra_body={"guided_choice": ["alpha", "beta", "gamma"]}) in ("alpha", "beta", "gamma")
    assert complete(extra_body={"structured_outputs": {"choice": ["x y", 'q"z']}}) in ("x y", 'q"z')
    grammar = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,3}/'
    assert re.fullmatch(r"\(\d{1,3}(,\d{1,3})*\)", complete(extra_body={"guided_grammar": grammar}))
    # Free-form JSON has unbounded strings the tiny model loops in; a repetition penalty (which
    # composes with the grammar) ends them.
    answer = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=200, temperature=0, response_format={"type": "json_object"},
        extra_body={"repetition_penalty": 1.3},
    )  # fmt: skip
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content), dict)


def test_streamed_structured_output_equals_the_whole_one(client):
    schema = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS[10]}}
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=200, temperature=0, response_format=schema)
    whole = client.chat.completions.create(**args).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args))
    assert streamed == whole
    jsonschema.validate(json.loads(streamed), SCHEMAS[10])


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMA_OF = {"get_weather": WEATHER, "get_time": TIME}


def _streamed_calls(stream) -> tuple[dict[int, dict], str | None]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = delta.id or call["id"]
            if delta.function is not None:
                call["name"] = delta.function.name or call["name"]
                call["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return calls, finish


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"]
)
def test_tool_choice_gives_calls_whose_arguments_validate_streamed_and_not(client, tool_choice):
    args = dict(model=MODEL, messages=MESSAGES, max_tokens=200, temperature=0, tools=TOOLS, tool_choice=tool_choice)
    answer = client.chat.completions.create(**args)
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA_OF[call.function.name])
    if isinstance(tool_choice, dict):
        assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
    calls, finish = _streamed_calls(client.chat.completions.create(stream=True, **args))
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls
    ]
    sampled = client.chat.completions.create(**{**args, "temperature": 1.0, "seed": 5})
    for call in sampled.choices[0].message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA_OF[call.function.name])


def test_parallel_tool_calls_false_gives_one_call(client):
    answer = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=200, temperature=1.0, seed=1, tools=TOOLS,
        tool_choice="required", parallel_tool_calls=False,
    )  # fmt: skip
    assert len(answer.choices[0].message.tool_calls) == 1


def test_a_tool_result_and_the_call_round_trip_through_the_template(servers, client):
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    response = httpx.post(servers["baseline"].url + "/tokenize", json={"model": MODEL, "messages": messages})
    assert response.status_code == 200, response.text
    tokenizer_text = httpx.post(
        servers["baseline"].url + "/detokenize", json={"model": MODEL, "tokens": response.json()["tokens"]}
    ).json()["prompt"]
    assert "# tool:\nsunny, 21 C" in tokenizer_text
    assert '"name": "get_weather"' in tokenizer_text and "<tool_call>" in tokenizer_text
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert answer.choices[0].message.content is not None


def test_auto_with_the_hermes_parser_reads_calls_out_of_text(client):
    # The bundled model never writes a <tool_call> block by itself; a grammar makes it, and the
    # parser must find the call and keep the text beside it as content.
    grammar = (
        'start: "ok <tool_call>{\\"name\\": \\"get_time\\", \\"arguments\\": {\\"zone\\": \\"UTC\\"}}</tool_call>"'
    )
    answer = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=60, temperature=0, tools=TOOLS, tool_choice="auto",
        extra_body={"guided_grammar": grammar},
    )  # fmt: skip
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "ok"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == {"zone": "UTC"}
    stream = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=60, temperature=0, tools=TOOLS, tool_choice="auto",
            extra_body={"guided_grammar": grammar}, stream=True,
        )
    )  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in stream).strip() == "ok"
    calls, finish = _streamed_calls(iter(stream))
    assert finish == "tool_calls" and [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        ("get_time", {"zone": "UTC"})
    ]


def _error(client: openai.OpenAI, **args) -> dict:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, **args)
    return caught.value.body


@pytest.mark.parametrize(
    ("args", "param", "named"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format", "strin"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array",
          "uniqueItems": True}}}}, "response_format", "uniqueItems"),
        ({"extra_body": {"guided_json": {"type": "object", "dependentSchemas": {}}}}, "guided_json",
         "dependentSchemas"),
        ({"extra_body": {"guided_regex": "(["}}, "guided_regex", "unclosed"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
        ({"response_format": {"type": "xml"}}, "response_format", "xml"),
        ({"extra_body": {"structured_outputs": {"jsn": {}}}}, "structured_outputs.jsn", "unknown"),
        ({"extra_body": {"guided_choice": ["a"], "guided_regex": "a"}}, "guided_choice", "one output constraint"),
        ({"extra_body": {"guided_decoding_backend": "outlines", "guided_regex": "a"}}, "guided_decoding_backend",
         "outlines"),
    ],
    ids=["invalid-schema", "unsupported-keyword", "unimplemented-keyword", "bad-regex", "unknown-function",
         "unknown-format-type", "unknown-structured-field", "two-constraints", "other-backend"],
)  # fmt: skip
def test_bad_constraints_get_a_400_naming_the_problem(client, args, param, named):
    body = _error(client, **args)
    error = body.get("error", body) if isinstance(body, dict) else {}
    assert error["param"] == param and named in error["message"], error


def test_tool_choice_auto_without_a_parser_names_the_flag():
    with pytest.raises(APIError) as caught:
        plan_tools(TOOLS, None, True, parser=None)  # omitted with tools: "auto", as OpenAI's default
    assert caught.value.param == "tool_choice" and "--tool-call-parser" in str(caught.value)
