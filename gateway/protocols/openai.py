"""OpenAI Chat Completions: request models, translation to a Chat, and responses."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.prompt import Chat, ChatMessage, TextPart, ToolDef
from gateway.protocols.common import MaxOutputTokens, OtherType, Seed, Strict, type_tag
from kvgate.errors import InvalidRequestError
from kvgate.usage import CACHE_5M, CACHE_24H

# prompt_cache_retention as OpenAI spells it, to our TTL classes.
RETENTION_TTL_S = {"in_memory": CACHE_5M.seconds, "in-memory": CACHE_5M.seconds, "24h": CACHE_24H.seconds}


class TextPartParam(Strict):
    type: Literal["text"]
    text: str


ContentPart = Annotated[
    Annotated[TextPartParam, Tag("text")] | Annotated[OtherType, Tag("other")],
    Discriminator(type_tag({"text"}, tag="text")),
]


class ChatMessageParam(BaseModel):
    # Loose on purpose: tool and function messages parse, then get a clear 400 below.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


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
    prompt_cache_retention: Literal["in_memory", "in-memory", "24h"] | None = None
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
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def _refuse(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param)


def check_supported(request: ChatCompletionRequest) -> None:
    if (request.n or 1) != 1:
        raise _refuse("n", "only n=1 is supported")
    if request.frequency_penalty or request.presence_penalty:
        raise _refuse("frequency_penalty", "frequency and presence penalties are not supported")
    if request.logprobs or request.top_logprobs:
        raise _refuse("logprobs", "logprobs are not supported")
    if request.logit_bias:
        raise _refuse("logit_bias", "logit_bias is not supported")
    if len(request.stop_sequences) > 4:
        raise _refuse("stop", "at most 4 stop sequences may be given")


def _content_text(message: ChatMessageParam, index: int) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if isinstance(part, OtherType):
            raise _refuse(f"messages.{index}.content.{j}", f"content parts of type {part.type!r} are not supported yet")
        texts.append(part.text)
    return "\n\n".join(texts)


def to_chat(request: ChatCompletionRequest) -> Chat:
    check_supported(request)
    messages = []
    for i, message in enumerate(request.messages):
        if message.role in ("tool", "function"):
            raise _refuse(f"messages.{i}.role", f"{message.role} messages are not supported yet")
        if message.tool_calls:
            raise _refuse(f"messages.{i}.tool_calls", "assistant tool calls are not supported yet")
        role = "system" if message.role == "developer" else message.role
        messages.append(ChatMessage(role, (TextPart(_content_text(message, i)),)))
    tools = tuple(ToolDef(t.model_dump(exclude_none=True)) for t in request.tools or [])
    return Chat(messages=tuple(messages), tools=tools)


# --- responses -----------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    cost_usd: Decimal | None = Field(None, exclude_if=lambda v: v is None)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


FinishReason = Literal["stop", "length"]


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
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvgate"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def finish_reason(engine_reason: str) -> FinishReason:
    return "length" if engine_reason == "length" else "stop"


def completion_id(request_id: str) -> str:
    return "chatcmpl-" + request_id.removeprefix("req_")
