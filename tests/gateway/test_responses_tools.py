"""Function tools on /v1/responses with the official openai SDK: function_call output items (whole and
streamed), the two-turn tool loop through previous_response_id reading the first turn from the cache,
tool_choice, parallel_tool_calls, and clear 400s.

The gateways are those of the chat tool tests (tiny Llama, generic tool format and a native tool
template); tests that need a call in the output queue its text (tests.gateway.scripted_outputs).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.gateway.harness import GatewayServer
from tests.gateway.scripted_outputs import ScriptedOutputs
from tests.gateway.test_tools_sdk import CALL, CALL_2, QUESTION, SYSTEM
from tests.gateway.tool_fixtures import anthropic_tools, model_with_tool_template

WEATHER = {"city": "Paris", "unit": "celsius"}


def tools() -> list[dict[str, Any]]:
    """The shared sample tools in the Responses API's flat form."""
    return [
        {"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
        for t in anthropic_tools(cache_last=False)
    ]


def unparsed(value: Any) -> Any:
    """A dump of the stream helper's ParsedResponse without the fields the helper adds."""
    if isinstance(value, dict):
        return {k: unparsed(v) for k, v in value.items() if k not in ("parsed", "parsed_arguments")}
    return [unparsed(v) for v in value] if isinstance(value, list) else value


class Server:
    def __init__(self, server: GatewayServer, scripted: ScriptedOutputs) -> None:
        self.server = server
        self.scripted = scripted

    def client(self, key: Any = None) -> openai.OpenAI:
        return self.server.openai(key or self.server.new_key())

    def body(self, **extra: Any) -> dict[str, Any]:
        body = {"model": self.server.model, "max_output_tokens": 4, "temperature": 0, "tools": tools()}
        return {**body, "instructions": SYSTEM, "input": QUESTION, **extra}


@pytest.fixture(scope="module", params=["generic", "native"])
def server(
    request: pytest.FixtureRequest, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    model_dir = tiny_llama_dir
    if request.param == "native":
        model_dir = model_with_tool_template(tiny_llama_dir, tmp_path_factory.mktemp("resp-tool-model") / "tiny-tools")
    holder: dict[str, ScriptedOutputs] = {}

    def wrap(engine: Any) -> ScriptedOutputs:
        holder["scripted"] = ScriptedOutputs(engine)
        return holder["scripted"]

    url = f"sqlite:///{tmp_path_factory.mktemp('resp-tools-db') / 'kvgate.db'}"
    gateway = GatewayServer(model_dir=model_dir, database_url=url, wrap_engine=wrap).start()
    try:
        assert gateway.gateway.prep.renderer.supports_tools() == (request.param == "native")
        yield Server(gateway, holder["scripted"])
    finally:
        gateway.stop()


def test_calls_are_function_call_items_and_the_loop_reads_turn_one_from_cache(server: Server) -> None:
    key = server.server.new_key()
    client = server.client(key)
    server.scripted.script.append("I will look it up.\n" + CALL)
    first = client.responses.create(**server.body())
    assert first.status == "completed" and first.completed_at is not None
    message, call = first.output
    assert message.type == "message" and message.status == "completed"
    assert message.content[0].text == "I will look it up." == first.output_text
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.call_id.startswith("call_") and call.id == "fc_" + call.call_id.removeprefix("call_")
    assert json.loads(call.arguments) == WEATHER
    assert [t.name for t in first.tools] == ["get_weather", "get_time"] and first.tools[0].type == "function"
    assert first.tool_choice == "auto" and first.parallel_tool_calls is True
    written = first.usage.input_tokens_details.cache_write_tokens
    assert first.usage.input_tokens_details.cached_tokens == 0 and written > 0
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()

    # Turn 2: only the call's output is sent; the call itself comes from the stored response.
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}
    server.scripted.script.append("It is 18 degrees and sunny in Paris.")
    second = client.responses.create(**server.body(previous_response_id=first.id, input=[output]))
    assert second.output_text == "It is 18 degrees and sunny in Paris." and second.status == "completed"
    assert [item.type for item in second.output] == ["message"]
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= written > 0
    assert cached > first.usage.input_tokens - 16  # all of turn 1's prompt, to the engine's last full block
    listed = client.responses.input_items.list(second.id)
    assert [(i.type, i.call_id) for i in listed.data] == [("function_call_output", call.call_id)]

    # Another tenant sends the same conversation whole (turn 1's output items as the SDK gave them):
    # the same prompt, nothing of the first tenant's cache read.
    server.scripted.script.append("Sunny.")
    whole = [{"role": "user", "content": QUESTION}, *first.output, output]
    fresh = server.client().responses.create(**server.body(input=whole))
    assert fresh.usage.input_tokens == second.usage.input_tokens
    assert fresh.usage.input_tokens_details.cached_tokens == 0


def test_a_continuation_must_answer_the_calls_it_follows(server: Server) -> None:
    client = server.client()
    server.scripted.script.append(CALL)
    first = client.responses.create(**server.body())
    [call] = first.output
    assert call.type == "function_call" and first.output_text == ""
    with pytest.raises(openai.BadRequestError) as unanswered:
        client.responses.create(**server.body(previous_response_id=first.id, input="And tomorrow?"))
    assert unanswered.value.body["message"] == f"No tool output found for function call {call.call_id}."
    stray = {"type": "function_call_output", "call_id": "call_nowhere", "output": "x"}
    with pytest.raises(openai.BadRequestError, match="No tool call found for function call output"):
        client.responses.create(**server.body(previous_response_id=first.id, input=[stray]))
    # Answered, the same continuation goes through.
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees"}
    assert client.responses.create(**server.body(previous_response_id=first.id, input=[answer])).status in (
        "completed",
        "incomplete",
    )


def test_stream_helper_accumulates_text_and_two_calls(server: Server) -> None:
    key = server.server.new_key()
    client = server.client(key)
    server.scripted.script.append("Checking both.\n" + CALL + "\n" + CALL_2)
    with client.responses.stream(**server.body()) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    call_events = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        *call_events,
        *call_events,
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # No piece of a tag went out as text.
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Checking both."
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [
        (0, "message"),
        (1, "function_call"),
        (2, "function_call"),
    ]
    assert added[1].item.arguments == "" and added[1].item.status == "in_progress"
    argument_deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert [e.output_index for e in argument_deltas] == [1, 2] and argument_deltas[1].item_id == added[2].item.id
    assert json.loads(argument_deltas[1].snapshot) == {"zone": "CET"}  # the helper's accumulated arguments

    assert final.status == "completed"
    assert [i.type for i in final.output] == ["message", "function_call", "function_call"]
    assert final.output_text == "Checking both."
    assert json.loads(final.output[1].arguments) == WEATHER and final.output[2].name == "get_time"
    assert final.output[1].call_id == added[1].item.call_id  # the ids streamed are the ids stored
    # Stored as streamed (the helper's final response adds its own parsed fields, left out here).
    assert client.responses.retrieve(final.id).model_dump() == unparsed(final.model_dump())


def test_tool_choice_none_parallel_off_and_max_tool_calls(server: Server) -> None:
    client = server.client()
    server.scripted.script.append(CALL)
    none = client.responses.create(**server.body(tool_choice="none"))
    assert [i.type for i in none.output] == ["message"] and none.output_text == CALL and none.tool_choice == "none"
    server.scripted.script.append(CALL + "\n" + CALL_2)
    both = client.responses.create(**server.body())
    assert [i.type for i in both.output] == ["function_call", "function_call"]
    server.scripted.script.append(CALL + "\n" + CALL_2)
    one = client.responses.create(**server.body(parallel_tool_calls=False))
    assert [i.name for i in one.output] == ["get_weather"] and one.parallel_tool_calls is False
    server.scripted.script.append(CALL + "\n" + CALL_2)
    capped = client.responses.create(**server.body(max_tool_calls=1))
    assert [i.name for i in capped.output] == ["get_weather"] and capped.max_tool_calls == 1
    # A call to a tool the request does not have stays text.
    server.scripted.script.append(CALL_2)
    only_weather = client.responses.create(**server.body(tools=tools()[:1]))
    assert only_weather.output_text == CALL_2 and [i.type for i in only_weather.output] == ["message"]
    named = client.responses.create(**server.body(tool_choice={"type": "function", "name": "get_time"}))
    assert named.tool_choice.type == "function" and named.tool_choice.name == "get_time"


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type", "tools of type 'web_search' are not supported"),
        ({"tools": [*tools(), tools()[0]]}, "tools.2.name", "used by more than one tool"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "no function named 'nope'"),
        ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools.0.parameters", "dictionary"),
        ({"tools": [{"type": "function", "name": "f", "extra": 1}]}, "tools.0.extra", "not permitted"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "get_time", "arguments": "{oops"}]},
            "input.0.arguments",
            "must be a JSON object",
        ),
        ({"tool_choice": "sometimes"}, "tool_choice", "must be 'none', 'auto', 'required'"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", "type 'file_search' is not supported"),
        ({"tools": [], "tool_choice": "required"}, "tool_choice", "needs at least one function"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools.0.name", "pattern"),
    ],
)
def test_bad_tools_and_tool_choices_are_400s(server: Server, extra: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        server.client().responses.create(**server.body(**extra))
    body = refused.value.body
    assert body["type"] == "invalid_request_error" and message in body["message"]
    assert body["param"] == param


def test_the_real_engine_output_with_tools(server: Server) -> None:
    response = server.client().responses.create(**server.body(max_output_tokens=6))  # random weights: text
    assert response.status in ("completed", "incomplete") and response.output[0].type == "message"
    assert response.usage.output_tokens >= 1


# Forced calls come from the random model itself: only enums and booleans, which it completes (an open
# string it would write until max_output_tokens), and no room for extra properties.
CLOSED_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Berlin"]}, "celsius": {"type": "boolean"}},
            "required": ["city", "celsius"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "get_time",
        "description": "The current time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["CET", "UTC"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
]


def test_forced_tool_choice_makes_the_real_engine_call_the_tool(server: Server) -> None:
    client = server.client()
    body = server.body(max_output_tokens=200, tools=CLOSED_TOOLS)
    named = client.responses.create(**{**body, "tool_choice": {"type": "function", "name": "get_weather"}})
    assert named.status == "completed"
    [call] = named.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Paris", "Berlin")
    required = client.responses.create(**{**body, "input": "What time is it in Berlin?", "tool_choice": "required"})
    assert required.status == "completed" and required.tool_choice == "required"
    [forced] = required.output
    assert forced.type == "function_call" and forced.name in ("get_weather", "get_time")
    assert isinstance(json.loads(forced.arguments), dict)
    # Streamed, the forced call arrives as function call events.
    with client.responses.stream(**{**body, "tool_choice": {"type": "function", "name": "get_time"}}) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and "response.output_text.delta" not in kinds
    assert [i.type for i in final.output] == ["function_call"] and final.output[0].name == "get_time"


def test_a_required_turn_then_an_auto_turn_reads_the_tools_and_instructions(server: Server) -> None:
    client = server.client()
    first = client.responses.create(**server.body(tool_choice="required", max_output_tokens=200))
    (call,) = [item for item in first.output if item.type == "function_call"]
    written = first.usage.input_tokens_details.cache_write_tokens
    assert first.usage.input_tokens_details.cached_tokens == 0 and written > 0
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees, sunny"}
    server.scripted.script.append("Sunny.")
    second = client.responses.create(**server.body(previous_response_id=first.id, input=[output], tool_choice="auto"))
    assert second.usage.input_tokens_details.cached_tokens >= written
