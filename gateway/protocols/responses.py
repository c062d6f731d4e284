"""OpenAI Responses API: the request, its input items in one canonical form, and the response object.

Input items are reduced to canonical JSON items (messages with text parts, function calls
and their outputs) before anything else: that form is what a stored response keeps as its
conversation, so that a later request naming it with previous_response_id rebuilds the
same conversation, renders the same prompt prefix and reads it from the cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.prompt import Chat, ChatMessage, ChatPart, TextPart, ToolCallPart, ToolDef, ToolResultPart
from gateway.protocols.cache_diagnostics import ResponsesPromptCacheOptions, echoed_options
from gateway.protocols.common import MaxOutputTokens, OtherType, Strict, refuse
from gateway.protocols.responses_tools import shown_choice, shown_tools, tool_choice
from gateway.tools.choice import ToolChoice

CanonicalItem = dict[str, Any]

# OpenAI's metadata limits: 16 pairs, keys up to 64 characters, values up to 512.
Metadata = dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]]


class TextInputPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # output_text sent back as it came
    logprobs: list[Any] | None = None
    prompt_cache_breakpoint: dict[str, Any] | None = None


class RefusalPart(Strict):
    type: Literal["refusal"]
    refusal: str


_PART_TAGS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}


def _part_kind(value: Any) -> str:
    found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    # Any JSON can arrive here (a list is unhashable): only a string can name a known part.
    return _PART_TAGS.get(found, "other") if isinstance(found, str) else "other"


ContentPart = Annotated[
    Annotated[TextInputPart, Tag("text")] | Annotated[RefusalPart, Tag("refusal")] | Annotated[OtherType, Tag("other")],
    Discriminator(_part_kind),
]


class MessageItem(Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    name: str | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None


def _item_kind(value: Any) -> str:
    found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if found is None or found == "message":
        return "message"  # an easy input message has no type
    return found if found in ("function_call", "function_call_output") else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[OtherType, Tag("other")],
    Discriminator(_item_kind),
]


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, min_length=1, max_length=64)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesStreamOptions(Strict):
    include_obfuscation: bool | None = None


class ResponsesRequest(Strict):
    model: str = Field(min_length=1)
    input: str | list[InputItem] | None = None
    instructions: str | None = None
    max_output_tokens: MaxOutputTokens | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    metadata: Metadata | None = Field(None, max_length=16)
    store: bool | None = None
    stream: bool | None = None
    stream_options: ResponsesStreamOptions | None = None
    previous_response_id: str | None = Field(None, min_length=1, max_length=64)
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "in-memory", "24h"] | None = None
    prompt_cache_options: ResponsesPromptCacheOptions | None = None
    cache_salt: str | None = Field(
        None, min_length=1, max_length=256, description="Partitions the cache further inside the tenant."
    )
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None  # checked by responses_tools.function_tools
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None

    @property
    def stored(self) -> bool:
        return self.store is not False  # OpenAI stores responses unless told not to


class InputTokensRequest(ResponsesRequest):
    """POST /v1/responses/input_tokens: a Responses body, counted as it would render; model optional."""

    model: str | None = Field(None, min_length=1)  # type: ignore[assignment]
    personality: str | None = Field(None, max_length=64)


def check_supported(request: ResponsesRequest) -> None:
    """Refuse, clearly, what kvgate does not do on /v1/responses (docs/gateway.md lists each)."""
    if request.background:
        raise refuse("background", "background responses are not supported")
    if request.conversation is not None:
        raise refuse("conversation", "conversations are not supported; use previous_response_id")
    if request.prompt is not None:
        raise refuse("prompt", "prompt templates are not supported")
    if request.truncation == "auto":
        raise refuse("truncation", "only truncation 'disabled' is supported: a too-long input is a 400")
    if request.top_logprobs or "message.output_text.logprobs" in (request.include or ()):
        raise refuse("top_logprobs", "logprobs are not supported")
    if request.reasoning and any(v is not None for v in request.reasoning.values()):
        raise refuse("reasoning", "this model does not reason; reasoning options are not supported")
    # Without new input a continuation would end on the earlier assistant turn, which the chat
    # path treats as a prefill to continue: refused instead of silently extending that answer.
    if not request.input:
        raise refuse("input", "input is required and must not be empty")
    fmt = request.text.format if request.text else None
    if fmt is not None and fmt.type == "json_schema" and (fmt.name is None or fmt.schema_ is None):
        raise refuse("text.format", "a json_schema format needs a name and a schema")


@dataclass(frozen=True)
class ResponseSettings:
    """What the response object echoes back of the request (all picklable)."""

    model: str
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    metadata: dict[str, str]
    store: bool
    previous_response_id: str | None
    prompt_cache_key: str | None
    prompt_cache_retention: str | None
    text: dict[str, object]
    user: str | None
    safety_identifier: str | None
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, str]
    parallel_tool_calls: bool
    max_tool_calls: int | None
    prompt_cache_options: dict[str, Any] | None = None  # as applied (gateway.protocols.cache_diagnostics)
    prompt_cache_diagnostics: dict[str, Any] | None = None  # set once the comparison is made


def _text_config(request: ResponsesRequest) -> dict[str, object]:
    fmt = request.text.format if request.text and request.text.format else None
    shown = fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
    return {"format": shown, "verbosity": (request.text.verbosity if request.text else None) or "medium"}


def choice_of(request: ResponsesRequest) -> ToolChoice:
    return tool_choice(request.tool_choice, request.tools, parallel=request.parallel_tool_calls)


def settings_of(request: ResponsesRequest, model: str) -> ResponseSettings:
    return ResponseSettings(
        model=model,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        metadata=dict(request.metadata or {}),
        store=request.stored,
        previous_response_id=request.previous_response_id,
        prompt_cache_key=request.prompt_cache_key,
        prompt_cache_retention=request.prompt_cache_retention,
        text=_text_config(request),
        user=request.user,
        safety_identifier=request.safety_identifier,
        tools=shown_tools(request.tools),
        tool_choice=shown_choice(choice_of(request)),
        parallel_tool_calls=request.parallel_tool_calls is not False,
        max_tool_calls=request.max_tool_calls,
        prompt_cache_options=echoed_options(request.prompt_cache_options),
    )


# --- input items, canonical ----------------------------------------------------------------------


def _parts_text(parts: str | list[Any], where: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        if isinstance(part, OtherType):
            raise refuse(f"{where}.{j}", f"content parts of type {part.type!r} are not supported yet")
        if isinstance(part, RefusalPart):
            texts.append(part.refusal)
            continue
        if part.prompt_cache_breakpoint is not None:
            raise refuse(f"{where}.{j}.prompt_cache_breakpoint", "not supported yet on /v1/responses")
        texts.append(part.text)
    return "\n\n".join(texts)


def message_item(role: str, text: str) -> CanonicalItem:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def canonical_input(request: ResponsesRequest) -> list[CanonicalItem]:
    """The request's input as canonical items: text messages, function calls, function call outputs."""
    if request.input is None:
        return []
    if isinstance(request.input, str):
        return [message_item("user", request.input)]
    items: list[CanonicalItem] = []
    for i, item in enumerate(request.input):
        where = f"input.{i}"
        if isinstance(item, OtherType):
            raise refuse(f"{where}.type", f"input items of type {item.type!r} are not supported")
        if isinstance(item, MessageItem):
            items.append(message_item(item.role, _parts_text(item.content, f"{where}.content")))
        elif isinstance(item, FunctionCallItem):
            _check_arguments(item.arguments, f"{where}.arguments")
            call = {"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments}
            items.append(call)
        else:
            output = _parts_text(item.output, f"{where}.output")
            items.append({"type": "function_call_output", "call_id": item.call_id, "output": output})
    return items


def _check_arguments(arguments: str, where: str) -> None:
    # Rendered as an object (a template's tool_calls, or the generic call text): anything else is a 400 here.
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise refuse(where, "must be a JSON object, as a string")


def _item_text(item: CanonicalItem) -> str:
    return "\n\n".join(part["text"] for part in item["content"])


def to_chat(
    instructions: str | None,
    items: list[CanonicalItem],
    tools: tuple[ToolDef, ...] = (),
    choice: ToolChoice | None = None,
) -> Chat:
    """Canonical items (the whole conversation) to a Chat; instructions lead as a system message.

    Consecutive function calls join one assistant message (as OpenAI's tool_calls do), and
    each function call output is its own "tool" message.
    """
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(ChatMessage("system", (TextPart(instructions),)))
    for item in items:
        if item["type"] == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append(ChatMessage(role, (TextPart(_item_text(item)),)))
        elif item["type"] == "function_call":
            part: ChatPart = ToolCallPart(item["call_id"], item["name"], item["arguments"])
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and isinstance(last.parts[-1], ToolCallPart):
                messages[-1] = ChatMessage("assistant", (*last.parts, part))
            else:
                messages.append(ChatMessage("assistant", (part,)))
        else:
            messages.append(ChatMessage("tool", (ToolResultPart(item["call_id"], item["output"]),)))
    if not messages:
        raise refuse("input", "the conversation is empty")
    return Chat(messages=tuple(messages), tools=tools, tool_choice=choice or ToolChoice())


_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def listed_items(items: list[CanonicalItem], response_id: str) -> list[CanonicalItem]:
    """A response's input items as GET /v1/responses/{id}/input_items lists them: each with an id and a status."""
    suffix = response_id.removeprefix("resp_")
    listed = []
    for i, item in enumerate(items):
        shown = {"id": f"{_ID_PREFIX[item['type']]}_{suffix}_{i}", **item, "status": "completed"}
        if item.get("role") == "assistant":  # listed as an output message, whose text parts carry annotations
            shown["content"] = [{**part, "annotations": []} for part in item["content"]]
        listed.append(shown)
    return listed
