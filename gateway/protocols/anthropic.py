"""The Anthropic Messages API: request models, translation to a Chat, and responses."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag

from gateway.prompt import BLOCK_SEPARATOR, Chat, ChatMessage, ChatPart, TextPart, ToolCallPart, ToolDef, ToolResultPart
from gateway.protocols.cache_diagnostics import Diagnostics, DiagnosticsParam
from gateway.protocols.common import MaxOutputTokens, OtherType, Strict, TopK, type_tag
from gateway.tools.choice import AUTO, ToolChoice
from gateway.tools.history import check_pairing
from kvgate.errors import InvalidRequestError
from kvgate.usage import TTL_BY_NAME

MAX_BREAKPOINTS = 4


class CacheControl(Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"

    @property
    def ttl_s(self) -> int:
        return TTL_BY_NAME[self.ttl].seconds


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None


def _block_kind(value: Any) -> str:
    found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return found if isinstance(found, str) and found in ("text", "tool_use", "tool_result") else "other"


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str = Field(pattern=r"^[a-zA-Z0-9_-]+$")
    name: str = Field(min_length=1, max_length=200)
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    # Sent back as they came in a response (the SDK serializes them); nothing to do with them here.
    caller: dict[str, Any] | None = None
    toolset_name: str | None = None


ToolResultContent = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[OtherType, Tag("other")],
    Discriminator(type_tag({"text"}, tag="text")),
]


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str = Field(pattern=r"^[a-zA-Z0-9_-]+$")
    content: str | list[ToolResultContent] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None
    toolset_name: str | None = None


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[OtherType, Tag("other")],
    Discriminator(_block_kind),
]


class MessageParam(Strict):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class ToolParam(Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None


ToolUnion = Annotated[
    Annotated[ToolParam, Tag("custom")] | Annotated[OtherType, Tag("other")],
    Discriminator(type_tag({None, "custom"}, tag="custom")),
]


class Metadata(Strict):
    user_id: str | None = Field(None, max_length=256)


class CountTokensRequest(Strict):
    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolUnion] | None = None
    tool_choice: dict[str, Any] | None = None
    cache_control: CacheControl | None = None
    thinking: dict[str, Any] | None = None
    # Accepted for SDK compatibility; they change nothing here.
    speed: Literal["standard", "fast"] | None = None
    output_config: dict[str, Any] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: MaxOutputTokens
    stop_sequences: list[str] | None = Field(None, max_length=16)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None
    stream: bool = False
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: str | None = None
    diagnostics: DiagnosticsParam | None = None  # cache diagnostics (gateway.protocols.cache_diagnostics)
    container: Any = None
    cache_salt: str | None = Field(
        None, min_length=1, max_length=256, description="Partitions the cache further inside the tenant."
    )


# --- translation ---------------------------------------------------------------------------------


def _unsupported(where: str, kind: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{where}: content blocks of type {kind!r} are not supported yet; "
        "only text, tool_use and tool_result blocks are",
        param=where,
    )


def _text_part(block: TextBlock, where: str) -> TextPart:
    if not block.text:
        raise InvalidRequestError(f"{where}: text content blocks must be non-empty", param=where)
    return TextPart(block.text, block.cache_control.ttl_s if block.cache_control else None)


def _check_unsupported_features(request: CountTokensRequest) -> None:
    if request.thinking and request.thinking.get("type") not in (None, "disabled"):
        raise InvalidRequestError("thinking: extended thinking is not supported by this model", param="thinking")
    if isinstance(request, MessagesRequest) and request.container is not None:
        raise InvalidRequestError("container: containers are not supported", param="container")


def to_chat(request: CountTokensRequest) -> Chat:
    """The request as a Chat, with its breakpoints validated (count, TTL order, automatic caching)
    and its tool calls and results paired."""
    _check_unsupported_features(request)
    tools: list[ToolDef] = []
    for i, tool in enumerate(request.tools or []):
        if isinstance(tool, OtherType):
            raise InvalidRequestError(f"tools.{i}: tools of type {tool.type!r} are not supported", param=f"tools.{i}")
        function = {"name": tool.name, "description": tool.description or "", "parameters": tool.input_schema}
        tools.append(
            ToolDef(
                {"type": "function", "function": function},
                tool.cache_control.ttl_s if tool.cache_control else None,
            )
        )

    messages: list[ChatMessage] = []
    if isinstance(request.system, str):
        if request.system:
            messages.append(ChatMessage("system", (TextPart(request.system),)))
    elif request.system:
        parts = tuple(_text_part(b, f"system.{j}") for j, b in enumerate(request.system))
        messages.append(ChatMessage("system", parts))

    turns = [ChatMessage(m.role, _message_parts(m, i)) for i, m in enumerate(request.messages)]
    if request.tools is None and any(not isinstance(p, TextPart) for m in turns for p in m.parts):
        raise InvalidRequestError(
            "Requests which include `tool_use` or `tool_result` blocks must define tools.", param="tools"
        )
    check_pairing(turns, style="anthropic")
    messages += turns

    if request.cache_control is not None:
        messages = _automatic_breakpoint(messages, request.cache_control.ttl_s)
    chat = Chat(messages=tuple(messages), tools=tuple(tools), tool_choice=tool_choice(request))
    _validate_breakpoints(chat)
    return chat


def _message_parts(message: MessageParam, i: int) -> tuple[ChatPart, ...]:
    if isinstance(message.content, str):
        return (TextPart(message.content),)
    if not message.content:
        raise InvalidRequestError(f"messages.{i}.content: must contain at least one block", param=f"messages.{i}")
    converted: list[ChatPart] = []
    for j, block in enumerate(message.content):
        where = f"messages.{i}.content.{j}"
        if isinstance(block, OtherType):
            raise _unsupported(where, block.type)
        if isinstance(block, ToolUseBlock):
            if message.role != "assistant":
                raise InvalidRequestError(f"{where}: tool_use blocks can only be in assistant messages", param=where)
            ttl = block.cache_control.ttl_s if block.cache_control else None
            converted.append(ToolCallPart(block.id, block.name, json.dumps(block.input, ensure_ascii=False), ttl))
        elif isinstance(block, ToolResultBlock):
            if message.role != "user":
                raise InvalidRequestError(f"{where}: tool_result blocks can only be in user messages", param=where)
            converted.append(_result_part(block, where))
        else:
            converted.append(_text_part(block, where))
    return tuple(converted)


def _result_part(block: ToolResultBlock, where: str) -> ToolResultPart:
    ttl = block.cache_control.ttl_s if block.cache_control else None
    if block.content is None or isinstance(block.content, str):
        content = block.content or ""
    else:
        texts = []
        for k, inner in enumerate(block.content):
            if isinstance(inner, OtherType):
                raise _unsupported(f"{where}.content.{k}", inner.type)
            texts.append(inner.text)
            ttl = ttl or (inner.cache_control.ttl_s if inner.cache_control else None)
        content = BLOCK_SEPARATOR.join(texts)
    return ToolResultPart(block.tool_use_id, content, bool(block.is_error), ttl)


def tool_choice(request: CountTokensRequest) -> ToolChoice:
    """tool_choice as a ToolChoice; 400 for a malformed one or a tool that is not in tools."""
    raw = request.tool_choice
    if raw is None:
        return AUTO
    kind, disable_parallel = raw.get("type"), raw.get("disable_parallel_tool_use", False)
    parallel = disable_parallel is not True
    allowed = {"auto", "any", "tool", "none"}
    if (
        not isinstance(kind, str)
        or kind not in allowed
        or not isinstance(disable_parallel, bool)
        or set(raw) - {"type", "name", "disable_parallel_tool_use"}
    ):
        raise InvalidRequestError(
            "tool_choice: must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}, "
            "with an optional boolean disable_parallel_tool_use",
            param="tool_choice",
        )
    names = [t.name for t in request.tools or [] if isinstance(t, ToolParam)]
    if kind in ("any", "tool") and not names:
        raise InvalidRequestError(f"tool_choice: type {kind!r} needs tools", param="tool_choice")
    if kind == "tool":
        name = raw.get("name")
        if name not in names:
            raise InvalidRequestError(f"tool_choice.name: no tool named {name!r} in tools", param="tool_choice.name")
        return ToolChoice("tool", name, parallel)
    return ToolChoice(kind, None, parallel)


def _automatic_breakpoint(messages: list[ChatMessage], ttl_s: int) -> list[ChatMessage]:
    # Top-level cache_control: the breakpoint goes on the last cacheable block.
    for i in range(len(messages) - 1, -1, -1):
        parts = messages[i].parts
        if parts and (not isinstance(parts[-1], TextPart) or parts[-1].text):
            if parts[-1].ttl_s is None:
                messages[i] = ChatMessage(messages[i].role, (*parts[:-1], replace(parts[-1], ttl_s=ttl_s)))
            break
    return messages


def _validate_breakpoints(chat: Chat) -> None:
    ttls = [t.ttl_s for t in chat.tools if t.ttl_s] + [p.ttl_s for m in chat.messages for p in m.parts if p.ttl_s]
    if len(ttls) > MAX_BREAKPOINTS:
        raise InvalidRequestError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(ttls)}."
        )
    for earlier, later in itertools.pairwise(ttls):
        if later > earlier:
            raise InvalidRequestError(
                "a cache_control breakpoint with ttl '1h' must not come after one with ttl '5m' "
                "(longer TTLs first, in the order tools, system, messages)"
            )


# --- responses -----------------------------------------------------------------------------------


class CacheCreation(BaseModel):
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int


class AnthropicUsage(BaseModel):
    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cache_creation: CacheCreation
    output_tokens: int
    service_tier: Literal["standard"] = "standard"
    cost_usd: Decimal | None = Field(None, exclude_if=lambda v: v is None)
    cost: float | None = Field(None, exclude_if=lambda v: v is None)  # cost_usd as a number (OpenRouter's)


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[TextContent | ToolUseContent]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: AnthropicUsage
    diagnostics: Diagnostics | None = None


class CountTokensResponse(BaseModel):
    input_tokens: int


def stop_reason(finish_reason: str, stop_sequence: str | None, *, tool_use: bool = False) -> StopReason:
    if finish_reason == "length":
        return "max_tokens"
    if tool_use:
        return "tool_use"
    return "stop_sequence" if stop_sequence else "end_turn"


def message_id(request_id: str) -> str:
    return "msg_" + request_id.removeprefix("req_")
