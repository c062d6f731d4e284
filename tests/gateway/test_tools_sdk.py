"""Tools end to end with the official SDKs: two-turn tool loops that read tools + system from the cache,
tool calls parsed from the output (whole and streamed), tool_choice, and the real engine's own output.

Two gateways: tiny Llama with SmolLM2's template (no tools: the generic format) and the
same model with a tool-capable template (native rendering). Their engine is real; the
tests that need a tool call in the output queue its text (tests.gateway.scripted_outputs).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from gateway.protocols import anthropic as anthropic_api
from gateway.protocols import openai as openai_api
from tests.gateway.harness import GatewayServer
from tests.gateway.scripted_outputs import ScriptedOutputs
from tests.gateway.tool_fixtures import anthropic_tools, model_with_tool_template, openai_tools

SYSTEM = "You are a weather assistant for travellers. Answer in one short sentence, with the unit."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
QUESTION = "What is the weather in Paris today? I am packing for a long weekend there and want to know what to wear."
EPHEMERAL = {"type": "ephemeral"}
CALL_2 = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


class ToolServer:
    def __init__(self, server: GatewayServer, scripted: ScriptedOutputs) -> None:
        self.server = server
        self.scripted = scripted

    def anthropic(self, key: Any = None) -> anthropic.Anthropic:
        return self.server.anthropic(key or self.server.new_key())

    def openai(self, key: Any = None) -> openai.OpenAI:
        return self.server.openai(key or self.server.new_key())


@pytest.fixture(scope="module", params=["generic", "native"])
def tools_server(
    request: pytest.FixtureRequest, tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToolServer]:
    model_dir = tiny_llama_dir
    if request.param == "native":
        model_dir = model_with_tool_template(tiny_llama_dir, tmp_path_factory.mktemp("tool-model") / "tiny-tools")
    holder: dict[str, ScriptedOutputs] = {}

    def wrap(engine: Any) -> ScriptedOutputs:
        holder["scripted"] = ScriptedOutputs(engine)
        return holder["scripted"]

    url = f"sqlite:///{tmp_path_factory.mktemp('tools-db') / 'kvgate.db'}"
    server = GatewayServer(model_dir=model_dir, database_url=url, wrap_engine=wrap).start()
    try:
        assert server.gateway.prep.renderer.supports_tools() == (request.param == "native")
        yield ToolServer(server, holder["scripted"])
    finally:
        server.stop()


def tools_and_system_tokens(ts: ToolServer, body: dict[str, Any]) -> int:
    """Tokens of the prompt up to the end of the tools and the system text (the later of their breakpoints:
    the generic format puts the tools first, a template may put the system text first)."""
    chat = anthropic_api.to_chat(anthropic_api.MessagesRequest.model_validate(body))
    tools_bp, system_bp, *_ = ts.server.gateway.prep.renderer.render(chat).breakpoints
    return max(tools_bp.token_end, system_bp.token_end)


def first_turn() -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 4,
        "tools": anthropic_tools(),  # cache_control on the last tool
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION, "cache_control": EPHEMERAL}]}],
    }


def test_anthropic_two_turn_tool_loop_reads_tools_and_system_from_cache(tools_server: ToolServer) -> None:
    ts = tools_server
    key = ts.server.new_key()
    client = ts.anthropic(key)
    body = {**first_turn(), "model": ts.server.model}
    ts.scripted.script.append("I will look it up.\n" + CALL)
    first = client.messages.create(**body)
    assert first.stop_reason == "tool_use"
    text, call = first.content
    assert text.type == "text" and text.text == "I will look it up."
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    assert call.input == {"city": "Paris", "unit": "celsius"}
    assert first.usage.cache_creation_input_tokens > 0 and first.usage.cache_read_input_tokens == 0

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 degrees, sunny"}
    body["messages"] = [
        *body["messages"],
        {"role": "assistant", "content": first.content},  # sent back as the SDK returned it
        {"role": "user", "content": [{**result, "cache_control": {"type": "ephemeral"}}]},
    ]
    ts.scripted.script.append("It is 18 degrees and sunny in Paris.")
    second = client.messages.create(**body)
    assert second.stop_reason == "end_turn" and second.content[0].text == "It is 18 degrees and sunny in Paris."
    prefix = tools_and_system_tokens(ts, first_turn())
    assert prefix > 100  # the tools and the system text, not a sliver of them
    assert second.usage.cache_read_input_tokens >= prefix
    counted = client.messages.count_tokens(**{k: v for k, v in body.items() if k != "max_tokens"})
    usage = second.usage
    assert (
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens == counted.input_tokens
    )

    # Another tenant sends the same second turn: nothing of the first tenant's cache is read.
    ts.scripted.script.append("It is sunny.")
    theirs = ts.anthropic().messages.create(**body)
    assert theirs.usage.cache_read_input_tokens == 0 and theirs.usage.cache_creation_input_tokens > 0


def test_openai_two_turn_tool_loop_reads_tools_and_system_from_cache(tools_server: ToolServer) -> None:
    ts = tools_server
    key = ts.server.new_key()
    client = ts.openai(key)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    body = {"model": ts.server.model, "max_tokens": 4, "temperature": 0, "tools": openai_tools()}
    ts.scripted.script.append(CALL)
    first = client.chat.completions.create(messages=messages, **body)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert first.usage.prompt_tokens_details.cached_tokens == 0

    messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    ts.scripted.script.append("It is 18 degrees and sunny.")
    second = client.chat.completions.create(messages=messages, **body)
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.tool_calls is None
    prefix = tools_and_system_tokens(ts, first_turn())
    assert second.usage.prompt_tokens_details.cached_tokens >= prefix > 100

    ts.scripted.script.append("Sunny.")
    theirs = ts.openai().chat.completions.create(messages=messages, **body)
    assert theirs.usage.prompt_tokens_details.cached_tokens == 0


def test_anthropic_stream_of_text_and_two_calls(tools_server: ToolServer) -> None:
    ts = tools_server
    ts.scripted.script.append("Checking both.\n" + CALL + "\n" + CALL_2)
    body = {**first_turn(), "model": ts.server.model}
    with ts.anthropic().messages.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[0].text == "Checking both."
    assert final.content[1].input == {"city": "Paris", "unit": "celsius"} and final.content[2].input == {"zone": "CET"}
    kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in events]
    assert ("content_block_delta", "input_json_delta") in kinds
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.index for s in starts] == [0, 1, 2] and starts[1].content_block.type == "tool_use"
    # No piece of the tag went out as text.
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == "Checking both."


def test_openai_stream_of_calls(tools_server: ToolServer) -> None:
    ts = tools_server
    ts.scripted.script.append(CALL + "\n" + CALL_2)
    stream = ts.openai().chat.completions.create(
        model=ts.server.model,
        max_tokens=4,
        messages=[{"role": "user", "content": "Weather and time in Paris?"}],
        tools=openai_tools(),
        stream=True,
        stream_options={"include_usage": True},
    )
    calls: dict[int, dict[str, str]] = {}
    content, finish = "", None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += delta.id or ""
                entry["name"] += (delta.function and delta.function.name) or ""
                entry["arguments"] += (delta.function and delta.function.arguments) or ""
    assert finish == "tool_calls" and content == ""
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_time"]
    assert json.loads(calls[1]["arguments"]) == {"zone": "CET"} and calls[0]["id"].startswith("call_")


def test_malformed_calls_stay_text_and_parallel_off_keeps_one_call(tools_server: ToolServer) -> None:
    ts = tools_server
    client = ts.anthropic()
    body = {**first_turn(), "model": ts.server.model}
    bad = '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>'
    ts.scripted.script.append(bad)
    message = client.messages.create(**body)
    assert message.stop_reason == "end_turn" and message.content[0].text == bad
    ts.scripted.script.append(CALL + "\n" + CALL_2)
    one = client.messages.create(**body, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [b.type for b in one.content] == ["tool_use"]
    ts.scripted.script.append(CALL + "\n" + CALL_2)
    both = client.messages.create(**body)
    assert [b.type for b in both.content] == ["tool_use", "tool_use"]
    # tool_choice none: the call is text.
    ts.scripted.script.append(CALL)
    none = client.messages.create(**body, tool_choice={"type": "none"})
    assert none.stop_reason == "end_turn" and none.content[0].text == CALL
    ts.scripted.script.append(CALL)
    chat = ts.openai().chat.completions.create(
        model=ts.server.model,
        max_tokens=4,
        messages=[{"role": "user", "content": "hi"}],
        tools=openai_tools(),
        tool_choice="none",
    )
    assert chat.choices[0].message.content == CALL and chat.choices[0].finish_reason == "stop"


def test_the_real_engine_output_with_tools_and_bad_requests(tools_server: ToolServer) -> None:
    ts = tools_server
    client = ts.anthropic()
    body = {**first_turn(), "model": ts.server.model, "max_tokens": 6}
    message = client.messages.create(**body)  # random weights: text, never a 500
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content[0].type == "text"
    assert message.usage.output_tokens >= 1
    chat = ts.openai().chat.completions.create(
        model=ts.server.model, max_tokens=6, messages=[{"role": "user", "content": "hi"}], tools=openai_tools()
    )
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.choices[0].message.content is not None
    with pytest.raises(anthropic.BadRequestError, match="unexpected `tool_use_id`"):
        bad = {"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "x"}
        client.messages.create(**{**body, "messages": [{"role": "user", "content": [bad]}]})
    with pytest.raises(anthropic.BadRequestError, match="no tool named"):
        client.messages.create(**body, tool_choice={"type": "tool", "name": "nope"})
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}
    with pytest.raises(openai.BadRequestError, match="must be a JSON object"):
        ts.openai().chat.completions.create(
            model=ts.server.model,
            messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}],
            tools=openai_tools(),
        )


def test_forced_tool_choice_makes_the_real_engine_call_the_tool(tools_server: ToolServer) -> None:
    ts = tools_server
    body = {**first_turn(), "model": ts.server.model, "max_tokens": 200}
    message = ts.anthropic().messages.create(**body, tool_choice={"type": "tool", "name": "get_weather"})
    assert message.stop_reason == "tool_use"
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "get_weather" and isinstance(call.input.get("city"), str)
    chat = ts.openai().chat.completions.create(
        model=ts.server.model,
        max_tokens=200,
        messages=[{"role": "user", "content": "What time is it in Berlin?"}],
        tools=openai_tools(),
        tool_choice="required",
    )
    assert chat.choices[0].finish_reason == "tool_calls"
    (forced,) = chat.choices[0].message.tool_calls or []
    assert forced.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(forced.function.arguments), dict)


def test_tool_calls_name_the_finish_reason() -> None:
    assert openai_api.finish_reason("stop", tool_calls=True) == "tool_calls"
    assert anthropic_api.stop_reason("length", None, tool_use=True) == "max_tokens"


def test_a_large_tools_body_is_prepared_in_a_worker_with_its_tool_parsing(tools_server: ToolServer) -> None:
    ts = tools_server
    tools = anthropic_tools()
    tools[0]["description"] = "Weather for travellers. " * 500  # over the inline bound: a worker prepares it
    body = {**first_turn(), "model": ts.server.model, "tools": tools}
    assert len(json.dumps(body)) > 8 * 1024
    ts.scripted.script.append(CALL)
    message = ts.anthropic().messages.create(**body)
    assert message.stop_reason == "tool_use" and message.content[0].input == {"city": "Paris", "unit": "celsius"}


def test_a_tool_choice_change_keeps_tools_and_system_cached_on_both_apis(tools_server: ToolServer) -> None:
    # Anthropic: a tool_choice change invalidates the message blocks only. Turn 1 forces a call
    # (the real engine, under the forcing grammar), turn 2 is auto: it reads the tools and system.
    ts = tools_server
    prefix = tools_and_system_tokens(ts, first_turn())
    client = ts.anthropic()
    body = {**first_turn(), "model": ts.server.model, "max_tokens": 200}
    first = client.messages.create(**body, tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use" and first.usage.cache_read_input_tokens == 0
    ts.scripted.script.append("It is sunny.")
    second = client.messages.create(**{**body, "max_tokens": 8}, tool_choice={"type": "auto"})
    assert second.usage.cache_read_input_tokens >= prefix > 100
    # Its positive twin: a changed system text is a different prefix, and reads none of it.
    ts.scripted.script.append("It is sunny.")
    changed = {**body, "max_tokens": 8, "system": [{"type": "text", "text": SYSTEM + " Be brief."}]}
    assert client.messages.create(**changed, tool_choice={"type": "auto"}).usage.cache_read_input_tokens < prefix

    chat = ts.openai()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    common = {"model": ts.server.model, "messages": messages, "tools": openai_tools(), "temperature": 0}
    forced = chat.chat.completions.create(**common, max_tokens=200, tool_choice="required")
    assert forced.choices[0].finish_reason == "tool_calls"
    ts.scripted.script.append("It is sunny.")
    auto = chat.chat.completions.create(**common, max_tokens=8, tool_choice="auto")
    assert auto.usage.prompt_tokens_details.cached_tokens >= prefix
