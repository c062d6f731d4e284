"""OpenAI Chat Completions: request models, translation to a Chat, and responses."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.prompt import BLOCK_SEPARATOR, Chat, ChatMessage, ChatPart, TextPart, ToolCallPart, ToolDef, ToolResultPart
from gateway.protocols.common import (
    MaxOutputTokens,
    OtherType,
    Seed,
    Strict,
    check_penalties,
    refuse,
    stop_tuple,
    type_tag,
)
from gateway.protocols.openai_caching import RETENTION_TTL_S as RETENTION_TTL_S  # where it used to live
from gateway.protocols.openai_caching import PromptCacheBreakpoint, PromptCacheOptions, breakpoint_ttl_s
from gateway.tools.choice import ToolChoice
from gateway.tools.history import check_pairing


class TextPartParam(Strict):
    type: Literal["text"]
    text: str
    prompt_cache_breakpoint: PromptCacheBreakpoint | None = None


ContentPart = Annotated[
    Annotated[TextPartParam, Tag("text")] | Annotated[OtherType, Tag("other")],
    Discriminator(type_tag({"text"}, tag="text")),
]


class ChatMessageParam(BaseModel):
    # Loose on purpose: function messages and odd tool calls parse, then get a clear 400 below.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class FunctionDef(Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolParam(Strict):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionRequest(Strict):
    model: str = Field(min_length=1)
    messages: list[ChatMessageParam] = Field(min_length=1)
    max_tokens: MaxOutputTokens | None = None
    max_completion_tokens: MaxOutputTokens | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    n: int | None = Field(None, ge=1, le=128)
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    seed: Seed | None = None
    user: str | None = None
    prompt_cache_key: str | None = Field(None, description="A routing hint; it does not change the cache salt.")
    prompt_cache_retention: Literal["in_memory", "in-memory", "24h"] | None = Field(
        None, description="Deprecated by OpenAI in favour of prompt_cache_options."
    )
    prompt_cache_options: PromptCacheOptions | None = None
    cache_salt: str | None = Field(
        None, min_length=1, max_length=256, description="Partitions the cache further inside the tenant."
    )
    tools: list[ToolParam] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    logit_bias: dict[str, Annotated[int, Field(ge=-100, le=100)]] | None = Field(None, max_length=1024)
    response_format: dict[str, Any] | None = None
    # OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512.
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = Field(
        None, max_length=16
    )
    store: bool | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return stop_tuple(self.stop)


def check_supported(request: ChatCompletionRequest) -> None:
    if (request.n or 1) != 1:
        raise refuse("n", "only n=1 is supported")
    check_penalties(request.frequency_penalty, request.presence_penalty)
    if request.logprobs or request.top_logprobs:
        raise refuse("logprobs", "logprobs are not supported")
    if request.logit_bias:
        raise refuse("logit_bias", "logit_bias is not supported")
    if len(request.stop_sequences) > 4:
        raise refuse("stop", "at most 4 stop sequences may be given")


def _content_parts(message: ChatMessageParam, index: int, options: PromptCacheOptions | None) -> tuple[TextPart, ...]:
    # One TextPart per content part: the renderer joins them as before, and a part with a
    # prompt_cache_breakpoint ends a cacheable prefix.
    if message.content is None:
        return (TextPart(""),)
    if isinstance(message.content, str):
        return (TextPart(message.content),)
    parts = []
    for j, part in enumerate(message.content):
        if isinstance(part, OtherType):
            raise refuse(f"messages.{index}.content.{j}", f"content parts of type {part.type!r} are not supported yet")
        parts.append(TextPart(part.text, breakpoint_ttl_s(part.prompt_cache_breakpoint, options)))
    return tuple(parts) or (TextPart(""),)


def to_chat(request: ChatCompletionRequest) -> Chat:
    check_supported(request)
    messages = [_message(message, i, request.prompt_cache_options) for i, message in enumerate(request.messages)]
    check_pairing(messages, style="openai")
    tools = tuple(ToolDef(t.model_dump(exclude_none=True)) for t in request.tools or [])
    return Chat(messages=tuple(messages), tools=tools, tool_choice=tool_choice(request))


def _message(message: ChatMessageParam, i: int, options: PromptCacheOptions | None) -> ChatMessage:
    if message.role == "function":
        raise refuse(
            f"messages.{i}.role", "function messages (the deprecated function-calling API) are not supported; use tools"
        )
    if message.tool_calls is not None and message.role != "assistant":
        raise refuse(f"messages.{i}.tool_calls", "only assistant messages can have tool_calls")
    parts = _content_parts(message, i, options)
    if message.role == "tool":
        if not message.tool_call_id:
            raise refuse(f"messages.{i}.tool_call_id", "tool messages need the tool_call_id they answer")
        text = BLOCK_SEPARATOR.join(part.text for part in parts)
        ttl_s = next((part.ttl_s for part in reversed(parts) if part.ttl_s), None)
        return ChatMessage("tool", (ToolResultPart(message.tool_call_id, text, ttl_s=ttl_s),))
    role = "system" if message.role == "developer" else message.role
    if not message.tool_calls:
        return ChatMessage(role, parts)
    with_calls: list[ChatPart] = [part for part in parts if part.text or part.ttl_s]
    with_calls += [_tool_call(call, f"messages.{i}.tool_calls.{k}") for k, call in enumerate(message.tool_calls)]
    return ChatMessage(role, tuple(with_calls))


def _tool_call(call: dict[str, Any], where: str) -> ToolCallPart:
    function = call.get("function")
    call_id, name = call.get("id"), function.get("name") if isinstance(function, dict) else None
    if call.get("type", "function") != "function" or not isinstance(call_id, str) or not isinstance(name, str):
        raise refuse(where, "a tool call needs an id, type 'function' and function.name")
    arguments = function.get("arguments", "{}")
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise refuse(f"{where}.function.arguments", "must be a JSON object, as a string")
    return ToolCallPart(call_id, name, json.dumps(parsed, ensure_ascii=False))


def tool_choice(request: ChatCompletionRequest) -> ToolChoice:
    """tool_choice and parallel_tool_calls as a ToolChoice; 400 for a malformed one or an unknown function."""
    raw, parallel = request.tool_choice, request.parallel_tool_calls is not False
    names = [t.function.name for t in request.tools or []]
    if raw is None:
        return ToolChoice("auto", None, parallel)
    if not names:
        raise refuse("tool_choice", "'tool_choice' is only allowed when 'tools' are specified")
    if raw in ("none", "auto", "required"):
        return ToolChoice({"required": "any"}.get(raw, raw), None, parallel)  # type: ignore[arg-type]
    function = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise refuse(
            "tool_choice",
            "must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
        )
    if name not in names:
        raise refuse("tool_choice", f"no function named {name!r} in tools")
    return ToolChoice("tool", name, parallel)


# --- responses -----------------------------------------------------------------------------------


class CacheWriteTokensDetails(BaseModel):
    """Cache writes by TTL class (kvgate's extension, shaped like the Responses API's ttl_30m/ttl_12h split)."""

    ttl_5m_tokens: int
    ttl_30m_tokens: int
    ttl_1h_tokens: int
    ttl_12h_tokens: int
    ttl_24h_tokens: int


class PromptTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int
    cache_write_tokens_details: CacheWriteTokensDetails | None = Field(None, exclude_if=lambda v: v is None)


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    cost_usd: Decimal | None = Field(None, exclude_if=lambda v: v is None)
    cost: float | None = Field(None, exclude_if=lambda v: v is None)  # cost_usd as a number (OpenRouter's)


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCall] | None = Field(None, exclude_if=lambda v: v is None)


FinishReason = Literal["stop", "length", "tool_calls"]


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    service_tier: Literal["default"] = "default"
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvgate"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def finish_reason(engine_reason: str, *, tool_calls: bool = False) -> FinishReason:
    if engine_reason == "length":
        return "length"
    return "tool_calls" if tool_calls else "stop"


def completion_id(request_id: str) -> str:
    return "chatcmpl-" + request_id.removeprefix("req_")
