"""Structured output on both APIs: OpenAI's response_format and Anthropic's output_config.format.

Each becomes the engine's StructuredOutput, which constrained decoding enforces. A schema
the grammar library cannot enforce is a 400 naming the field here, while the request is
prepared, before any admission or engine work.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.protocols.common import refuse
from inference.grammar import check_structured
from inference.types import InvalidRequestError as EngineInvalidRequest
from inference.types import StructuredOutput


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class JsonSchemaSpec(_Strict):
    """OpenAI's response_format.json_schema."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class OpenAIResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class AnthropicOutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]


def _checked(spec: StructuredOutput, param: str) -> StructuredOutput:
    try:
        check_structured(spec)
    except EngineInvalidRequest as exc:
        raise refuse(param, str(exc)) from exc
    return spec


def json_schema_output(schema: dict[str, Any] | None, *, strict: bool, param: str) -> StructuredOutput:
    """A JSON schema to enforce. strict=False (OpenAI's default) ignores keywords the library cannot
    enforce instead of refusing them, as OpenAI only guarantees the schema under strict."""
    if schema is None:
        schema = {}  # OpenAI's json_schema without a schema: any JSON value
    options = schema.get("x-guidance", {})
    if not strict and isinstance(options, dict):  # anything else: llguidance says what is wrong with it
        schema = {**schema, "x-guidance": {"lenient": True, **options}}
    return _checked(StructuredOutput("json_schema", json.dumps(schema)), param)


def openai_structured(
    response_format: dict[str, Any] | None, *, param: str = "response_format"
) -> StructuredOutput | None:
    """OpenAI Chat Completions' response_format as a StructuredOutput (None for text)."""
    if response_format is None:
        return None
    try:
        parsed = OpenAIResponseFormat.model_validate(response_format)
    except ValidationError as exc:
        raise refuse(param, _first_error(exc)) from exc
    if parsed.type == "text":
        return None
    if parsed.type == "json_object":
        return _checked(StructuredOutput("json_object"), param)
    if parsed.json_schema is None:
        raise refuse(param, "json_schema is required when type is 'json_schema'")
    return json_schema_output(parsed.json_schema.schema_, strict=bool(parsed.json_schema.strict), param=param)


def anthropic_structured(output_config: dict[str, Any] | None) -> StructuredOutput | None:
    """Anthropic's output_config.format (structured outputs) as a StructuredOutput; None without one."""
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    param = "output_config.format"
    try:
        parsed = AnthropicOutputFormat.model_validate(fmt)
    except ValidationError as exc:
        raise refuse(param, _first_error(exc)) from exc
    return json_schema_output(parsed.schema_, strict=True, param=param)
