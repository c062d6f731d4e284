"""/v1/chat/completions through the openai SDK."""

from __future__ import annotations

import json

import openai
import pytest

from tests.inference.server.conftest import RunningServer

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Name a colour."}, {"type": "text", "text": "Just one."}]},
]


def test_whole_chat_renders_the_template(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    engine = tiny_server.engine
    out = client.chat.completions.create(model=engine.model_id, messages=MESSAGES, temperature=0, max_tokens=5)
    assert out.object == "chat.completion"
    assert out.id.startswith("chatcmpl-")
    [choice] = out.choices
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    # Text parts are joined with newlines, then the model's chat template applies.
    rendered = engine.apply_chat_template(
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour.\nJust one."}]
    )
    assert out.usage is not None
    assert out.usage.prompt_tokens == len(engine.encode(rendered))
    assert out.usage.completion_tokens == 5


def test_streamed_chat_matches_whole(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    model = tiny_server.engine.model_id
    whole = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=6)
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            temperature=0,
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    first, *content, finish, usage = chunks
    assert first.object == "chat.completion.chunk"
    assert first.choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == whole.choices[0].message.content
    assert finish.choices[0].finish_reason == "length"
    assert usage.choices == []
    assert usage.usage is not None
    assert whole.usage is not None
    assert usage.usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])


def test_max_completion_tokens_wins_over_max_tokens(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=tiny_server.engine.model_id,
        messages=[{"role": "user", "content": "Hi"}],
        temperature=0,
        max_tokens=9,
        max_completion_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert out.usage is not None
    assert out.usage.completion_tokens == 3


def test_response_format_json_schema_and_a_bad_schema(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    model = tiny_server.engine.model_id
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "blue"]}, "bright": {"type": "boolean"}},
        "required": ["colour", "bright"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}
    out = client.chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=50, response_format=fmt
    )
    assert out.choices[0].finish_reason == "stop"
    value = json.loads(out.choices[0].message.content)
    assert value["colour"] in ("red", "blue") and isinstance(value["bright"], bool)
    bad = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "strin"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=5, response_format=bad)
    assert refused.value.body["param"] == "response_format" and "strin" in refused.value.body["message"]
