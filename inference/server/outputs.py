"""From engine results to response bodies, for completions and for chat completions.

The two endpoints differ only in the shape of a choice, so each is an OutputFormat
and the route and streaming code are shared.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

from inference.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    PromptTokensDetails,
    UsageInfo,
)
from inference.tiers import TIER_NAMES
from inference.types import RequestOutput, SamplingParams, Usage


@dataclass(frozen=True)
class ResponseContext:
    """What every body and chunk of one response repeats."""

    id: str
    model: str
    params: SamplingParams
    created: int = field(default_factory=lambda: int(time.time()))


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage_info(usage: Usage) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=usage.cached_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            cached_tokens_by_tier={name: usage.cached_tokens_by_tier.get(name, 0) for name in TIER_NAMES},
            cache_write_tokens_by_ttl={str(ttl): n for ttl, n in sorted(usage.cache_write_tokens_by_ttl.items())},
        ),
    )


def stop_reason(output: RequestOutput, params: SamplingParams) -> int | str | None:
    """As vLLM: the stop string or stop token id that ended the output; None for EOS or length."""
    if output.finish_reason != "stop":
        return None
    if output.stop_sequence is not None:
        return output.stop_sequence
    if output.token_ids and output.token_ids[-1] in params.stop_token_ids:
        return output.token_ids[-1]
    return None


class OutputFormat(Protocol):
    id_prefix: str

    def whole(self, ctx: ResponseContext, output: RequestOutput) -> BaseModel: ...

    def opening(self, ctx: ResponseContext) -> BaseModel | None: ...

    def text(self, ctx: ResponseContext, text: str) -> BaseModel: ...

    def finish(self, ctx: ResponseContext, output: RequestOutput) -> BaseModel: ...

    def usage(self, ctx: ResponseContext, usage: Usage) -> BaseModel: ...


class CompletionFormat:
    id_prefix = "cmpl"

    def whole(self, ctx: ResponseContext, output: RequestOutput) -> CompletionResponse:
        choice = CompletionChoice(
            text=output.text,
            finish_reason=output.finish_reason,
            stop_reason=stop_reason(output, ctx.params),
        )
        return self._body(ctx, [choice], usage_info(output.usage))

    def opening(self, ctx: ResponseContext) -> None:
        return None

    def text(self, ctx: ResponseContext, text: str) -> CompletionResponse:
        return self._body(ctx, [CompletionChoice(text=text)])

    def finish(self, ctx: ResponseContext, output: RequestOutput) -> CompletionResponse:
        choice = CompletionChoice(
            text="", finish_reason=output.finish_reason, stop_reason=stop_reason(output, ctx.params)
        )
        return self._body(ctx, [choice])

    def usage(self, ctx: ResponseContext, usage: Usage) -> CompletionResponse:
        return self._body(ctx, [], usage_info(usage))

    @staticmethod
    def _body(
        ctx: ResponseContext, choices: list[CompletionChoice], usage: UsageInfo | None = None
    ) -> CompletionResponse:
        return CompletionResponse(id=ctx.id, created=ctx.created, model=ctx.model, choices=choices, usage=usage)


class ChatFormat:
    id_prefix = "chatcmpl"

    def whole(self, ctx: ResponseContext, output: RequestOutput) -> ChatCompletionResponse:
        choice = ChatChoice(
            message=AssistantMessage(content=output.text),
            finish_reason=output.finish_reason,
            stop_reason=stop_reason(output, ctx.params),
        )
        return ChatCompletionResponse(
            id=ctx.id, created=ctx.created, model=ctx.model, choices=[choice], usage=usage_info(output.usage)
        )

    def opening(self, ctx: ResponseContext) -> ChatCompletionChunk:
        # As OpenAI and vLLM: the role comes first, in a chunk of its own.
        return self._chunk(ctx, [ChatChunkChoice(delta={"role": "assistant", "content": ""})])

    def text(self, ctx: ResponseContext, text: str) -> ChatCompletionChunk:
        return self._chunk(ctx, [ChatChunkChoice(delta={"content": text})])

    def finish(self, ctx: ResponseContext, output: RequestOutput) -> ChatCompletionChunk:
        choice = ChatChunkChoice(
            delta={}, finish_reason=output.finish_reason, stop_reason=stop_reason(output, ctx.params)
        )
        return self._chunk(ctx, [choice])

    def usage(self, ctx: ResponseContext, usage: Usage) -> ChatCompletionChunk:
        return self._chunk(ctx, [], usage_info(usage))

    @staticmethod
    def _chunk(
        ctx: ResponseContext, choices: list[ChatChunkChoice], usage: UsageInfo | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=ctx.id, created=ctx.created, model=ctx.model, choices=choices, usage=usage)


COMPLETION = CompletionFormat()
CHAT = ChatFormat()
