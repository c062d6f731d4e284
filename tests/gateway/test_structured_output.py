"""Structured output through both official SDKs: OpenAI's response_format and `parse`, Anthropic's output_config.

The tiny random-weight model writes nothing sensible on its own, so everything that parses
here parses because constrained decoding made it.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import anthropic
import openai
import pytest
from pydantic import BaseModel, Field

from gateway.protocols.structured import anthropic_structured, openai_structured
from inference.types import StructuredOutput
from kvgate.errors import InvalidRequestError
from tests.gateway.harness import GatewayServer

MESSAGES = [{"role": "user", "content": "Describe a pet as JSON."}]


class Pet(BaseModel):
    species: Literal["cat", "dog", "fish"]
    indoor: bool
    name: str = Field(min_length=1, max_length=8)


class Owner(BaseModel):
    pets: list[Pet] = Field(min_length=1, max_length=2)
    verified: bool


class Flag(BaseModel):
    """Only enums and booleans: Anthropic's SDK moves length bounds into descriptions."""

    colour: Literal["red", "green", "blue"]
    on: bool


def test_parse_with_a_pydantic_model(gateway: GatewayServer) -> None:
    client = gateway.openai(gateway.new_key())
    for model in (Pet, Owner):
        completion = client.chat.completions.parse(
            model=gateway.model, messages=MESSAGES, response_format=model, max_tokens=200, temperature=0
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, model), choice.message.content
        assert model.model_validate_json(choice.message.content) == choice.message.parsed
    # Without the format the same model and prompt write no JSON at all.
    plain = client.chat.completions.create(model=gateway.model, messages=MESSAGES, max_tokens=20, temperature=0)
    with pytest.raises(ValueError):
        json.loads(plain.choices[0].message.content)


def test_json_schema_by_hand_streams_and_respects_max_tokens(gateway: GatewayServer) -> None:
    client = gateway.openai(gateway.new_key())
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": Pet.model_json_schema(), "strict": True}}
    stream = client.chat.completions.create(
        model=gateway.model,
        messages=MESSAGES,
        response_format=fmt,
        max_tokens=200,
        temperature=0.8,
        seed=3,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    Pet.model_validate_json(text)
    # Cut short by max_tokens: "length", as without a format.
    short = client.chat.completions.create(
        model=gateway.model, messages=MESSAGES, response_format=fmt, max_tokens=2, temperature=0
    )
    assert short.choices[0].finish_reason == "length" and short.choices[0].message.content.startswith("{")


def test_json_object_and_text(gateway: GatewayServer) -> None:
    client = gateway.openai(gateway.new_key())
    out = client.chat.completions.create(
        model=gateway.model, messages=MESSAGES, response_format={"type": "json_object"}, max_tokens=16, temperature=0
    )
    content = out.choices[0].message.content
    assert content.startswith("{")  # an object, which a random model rarely closes within 16 tokens
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    text = client.chat.completions.create(
        model=gateway.model, messages=MESSAGES, response_format={"type": "text"}, max_tokens=4, temperature=0
    )
    assert text.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, "Invalid type: strin"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {"$ref": "#/$defs/nope"}}},
            "does not exist",
        ),
        ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}, "name"),
        ({"type": "json_schema"}, "json_schema is required"),
        ({"type": "xml"}, "type"),
    ],
)
def test_bad_formats_are_a_400_naming_response_format(gateway: GatewayServer, fmt: dict, message: str) -> None:
    client = gateway.openai(gateway.new_key())
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=gateway.model, messages=MESSAGES, response_format=fmt, max_tokens=4)
    body = refused.value.body
    assert body["param"] == "response_format" and body["type"] == "invalid_request_error"
    assert message in body["message"]


def test_anthropic_output_config_format(gateway: GatewayServer) -> None:
    client = gateway.anthropic(gateway.new_key())
    message = client.messages.parse(
        model=gateway.model, max_tokens=100, messages=MESSAGES, output_format=Flag, extra_body={"temperature": 0}
    )
    assert message.stop_reason == "end_turn"
    assert isinstance(message.content[0].parsed_output, Flag), message.content[0].text
    raw = client.messages.create(
        model=gateway.model,
        max_tokens=100,
        messages=MESSAGES,
        output_config={"format": {"type": "json_schema", "schema": Flag.model_json_schema()}},
        extra_body={"temperature": 0},
    )
    assert Flag.model_validate_json(raw.content[0].text) == message.content[0].parsed_output
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model=gateway.model,
            max_tokens=10,
            messages=MESSAGES,
            output_config={"format": {"type": "json_schema", "schema": {"type": "strin"}}},
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "output_config.format" in refused.value.body["error"]["message"]


# -- the mapping, without a server ------------------------------------------------------------------------


def test_response_format_mapping() -> None:
    assert openai_structured(None) is None and openai_structured({"type": "text"}) is None
    assert openai_structured({"type": "json_object"}) == StructuredOutput("json_object")
    strict = openai_structured(
        {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "integer"}, "strict": True}}
    )
    assert strict == StructuredOutput("json_schema", '{"type": "integer"}')
    # Not strict (OpenAI's default): keywords llguidance cannot enforce are ignored, not refused.
    loose_schema: dict[str, Any] = {"type": "array", "uniqueItems": True}
    loose = openai_structured({"type": "json_schema", "json_schema": {"name": "p", "schema": loose_schema}})
    assert loose is not None and json.loads(loose.value)["x-guidance"] == {"lenient": True}
    with pytest.raises(InvalidRequestError, match="uniqueItems") as refused:
        openai_structured({"type": "json_schema", "json_schema": {"name": "p", "schema": loose_schema, "strict": True}})
    assert refused.value.param == "response_format"
    assert anthropic_structured(None) is None and anthropic_structured({"effort": "low"}) is None
    with pytest.raises(InvalidRequestError) as bad:
        anthropic_structured({"format": {"type": "json_schema"}})
    assert bad.value.param == "output_config.format"
