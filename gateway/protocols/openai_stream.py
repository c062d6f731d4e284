"""OpenAI responses from a Generation: the completion body, and the chunk stream."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

import structlog

from gateway.api.errors import openai_body
from gateway.generation import Finished, Generation, output_error
from gateway.logs import log_failure
from gateway.protocols.openai import (
    AssistantMessage,
    CacheWriteTokensDetails,
    ChatCompletion,
    Choice,
    CompletionUsage,
    PromptTokensDetails,
    completion_id,
    finish_reason,
)
from gateway.sse import COMMENT_KEEPALIVE, event, keepalive_until_first
from inference.types import TokenDelta
from kvgate.usage import TTL_CLASSES

log = structlog.get_logger("kvgate.gateway")


def usage_of(finished: Finished) -> CompletionUsage:
    counts = finished.counts
    return CompletionUsage(
        prompt_tokens=counts.prompt_tokens,
        completion_tokens=counts.output,
        total_tokens=counts.prompt_tokens + counts.output,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=counts.cache_read,
            cache_write_tokens=counts.cache_writes,
            cache_write_tokens_details=CacheWriteTokensDetails(
                **{f"ttl_{t.name}_tokens": getattr(counts, t.category.value) for t in TTL_CLASSES}
            ),
        ),
        cost_usd=finished.cost_usd,
    )


def completion_of(finished: Finished, *, request_id: str, model: str, created: int) -> ChatCompletion:
    return ChatCompletion(
        id=completion_id(request_id),
        created=created,
        model=model,
        choices=[
            Choice(
                message=AssistantMessage(content=finished.output.text),
                finish_reason=finish_reason(finished.output.finish_reason),
            )
        ],
        usage=usage_of(finished),
    )


async def chunk_events(
    gen: Generation, *, request_id: str, model: str, include_usage: bool
) -> AsyncGenerator[bytes, None]:
    created = int(time.time())
    base = {"id": completion_id(request_id), "object": "chat.completion.chunk", "created": created, "model": model}
    usage_field: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        return event(None, {**base, "choices": [choice], **usage_field})

    done = False
    try:
        # The role chunk goes at once; until the first token, an SSE comment every few seconds.
        yield chunk({"role": "assistant", "content": ""})
        deltas = gen.handle.__aiter__()
        arrived: list[TokenDelta | None] = []
        async with contextlib.aclosing(keepalive_until_first(deltas, arrived, keepalive=COMMENT_KEEPALIVE)) as pings:
            async for ping in pings:
                yield ping
        delta = arrived[0]
        while delta is not None:
            if delta.text:
                yield chunk({"content": delta.text})
            delta = await anext(deltas, None)
        finished = await gen.finish(await gen.handle.result())
        done = True
        if finished.status == "error":
            yield event(None, openai_body(output_error(finished.output)))
            return
        yield chunk({}, finish_reason(finished.output.finish_reason))
        if include_usage:
            usage = usage_of(finished).model_dump(mode="json")
            yield event(None, {**base, "choices": [], "usage": usage})
        yield event(None, "[DONE]")
    except Exception:
        log_failure(log, "stream_failed", request_id=request_id)
        error = {"message": "Internal server error", "type": "server_error", "param": None, "code": None}
        yield event(None, {"error": error})
    finally:
        if not done:
            gen.abandon()
