"""The wire format of the engine server: vLLM's OpenAI-compatible request and response bodies.

Requests ignore unknown fields, as vLLM's do, so clients written for OpenAI or vLLM
can send their usual extras. Fields we cannot honour are refused in inputs.py rather
than silently ignored.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from inference.types import MAX_TTL_S

# Every number has bounds, so that no value reaches the engine that it cannot hold: out of
# range is a 400 naming the field.
INT32_MAX = 2**31 - 1
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Probability = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
# Above any model's context; the engine clips to what the prompt leaves.
MaxTokens = Annotated[int, Field(ge=1, le=1_000_000)]
# torch generators take 64-bit seeds; anything wider would fail deep in the engine.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
TokenIds = list[Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]]
MAX_STOP_STRINGS = 64
MAX_STOP_TOKEN_IDS = 1024
MAX_SALT_CHARS = 256
MAX_REGIONS = 16


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    # vLLM's default: asking for stream options at all means wanting the usage chunk.
    include_usage: bool = True
    # vLLM's option: every chunk carries the usage so far. Ours then includes the prompt's cache
    # accounting (prompt_tokens_details), exact from the first text chunk on, since prefill is done
    # by then: what gateway.backends.http needs before it hands out the first delta.
    continuous_usage_stats: bool = False


class CacheRegionIn(_Body):
    """kvgate's extension: prompt tokens [0, end) may be cached for ttl_s seconds."""

    end: Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]
    ttl_s: Annotated[StrictInt, Field(gt=0, le=MAX_TTL_S)]


class FairShareIn(_Body):
    """kvgate's extension, set by the gateway: whose queue the request waits in, and its weight."""

    key: str = Field(max_length=200)
    weight: Annotated[StrictInt, Field(ge=1, le=1000)] = 1


class SamplingFields(_Body):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    temperature: NonNegativeFloat | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None
    seed: Seed | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[TokenIds, Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    # Optional as in vLLM: some clients send null for "the default".
    ignore_eos: bool | None = False
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: str | None = Field(None, max_length=MAX_SALT_CHARS)
    cache_regions: list[CacheRegionIn] | None = Field(None, max_length=MAX_REGIONS)
    fair_share: FairShareIn | None = None
    # vLLM's structured outputs: {"json": schema} | {"json_object": true} | {"grammar": "..."} (llguidance Lark).
    structured_outputs: dict[str, Any] | None = None

    @field_validator("cache_salt")
    @classmethod
    def _salt_not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value:
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only n=1 is supported; send one request per choice")
        return value


class CompletionRequest(SamplingFields):
    prompt: str | TokenIds | list[str] | list[TokenIds]
    max_tokens: MaxTokens | None = 16
    echo: bool | None = False
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    best_of: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    suffix: str | None = None
    add_special_tokens: bool = True
    # As vLLM's completions take it: text, json_object or json_schema.
    response_format: dict[str, Any] | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


# -- responses ------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int
    cache_write_tokens: int
    # Tier name -> tokens read from it: "device", then each tier below ("host", "disk", "redis").
    cached_tokens_by_tier: dict[str, int]
    # TTL in seconds (as a string key) -> tokens written: what billing prices per TTL.
    cache_write_tokens_by_ttl: dict[str, int]


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class _Response(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    # vLLM's extension: the stop string or stop token id that ended the output, else null.
    stop_reason: int | str | None = None


class CompletionResponse(_Response):
    """A whole completion, and (with usage null or choices empty) a streamed chunk."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    tool_calls: list[Any] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None
    stop_reason: int | str | None = None


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: UsageInfo


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: dict[str, str]
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "kvgate"
    root: str | None = None
    parent: str | None = None
    max_model_len: int
    permission: list[Any] = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo
