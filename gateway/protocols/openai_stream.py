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
from gateway.protocols.common import cost_number
from gateway.protocols.openai import (
    AssistantMessage,
    CacheWriteTokensDetails,
    ChatCompletion,
    Choice,
    CompletionUsage,
    FunctionCall,
    PromptTokensDetails,
    ToolCall,
    completion_id,
    finish_reason,
)
from gateway.sse import COMMENT_KEEPALIVE, event, keepalive_until_first
from gateway.tools.parse import CallOut, ParseEvent, ToolCallParser, ToolParsing, new_call_id, parse_output
from inference.types import TokenDelta
from kvgate.usage import TTL_CLASSES

ID_PREFIX = "call_"

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
        cost=cost_number(finished.cost_usd),
    )


def message_of(text: str, tools: ToolParsing | None) -> AssistantMessage:
    """The reply: its text, and its tool calls when the request had tools and the output holds some."""
    if tools is None:
        return AssistantMessage(content=text)
    events = parse_output(text, tools, id_prefix=ID_PREFIX)
    calls = [
        ToolCall(id=e.call.id, function=FunctionCall(name=e.call.name, arguments=e.call.arguments))
        for e in events
        if isinstance(e, CallOut)
    ]
    content = "".join(e.text for e in events if not isinstance(e, CallOut))
    if not calls:
        return AssistantMessage(content=content)
    return AssistantMessage(content=content or None, tool_calls=calls)


def completion_of(
    finished: Finished, *, request_id: str, model: str, created: int, tools: ToolParsing | None = None
) -> ChatCompletion:
    message = message_of(finished.output.text, tools)
    return ChatCompletion(
        id=completion_id(request_id),
        created=created,
        model=model,
        choices=[
            Choice(
                message=message,
                finish_reason=finish_reason(finished.output.finish_reason, tool_calls=bool(message.tool_calls)),
            )
        ],
        usage=usage_of(finished),
    )


def _deltas(events: list[ParseEvent], first_index: int) -> list[dict[str, Any]]:
    # A call goes out as two deltas: its index, id and name, then its arguments.
    out: list[dict[str, Any]] = []
    index = first_index
    for e in events:
        if isinstance(e, CallOut):
            function = {"name": e.call.name, "arguments": ""}
            out.append({"tool_calls": [{"index": index, "id": e.call.id, "type": "function", "function": function}]})
            out.append({"tool_calls": [{"index": index, "function": {"arguments": e.call.arguments}}]})
            index += 1
        else:
            out.append({"content": e.text})
    return out


async def chunk_events(
    gen: Generation, *, request_id: str, model: str, include_usage: bool, tools: ToolParsing | None = None
) -> AsyncGenerator[bytes, None]:
    created = int(time.time())
    base = {"id": completion_id(request_id), "object": "chat.completion.chunk", "created": created, "model": model}
    base["service_tier"] = "default"
    usage_field: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        return event(None, {**base, "choices": [choice], **usage_field})

    parser = ToolCallParser(tools, new_id=lambda: new_call_id(ID_PREFIX)) if tools else None
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
            if parser is not None:
                before = parser.calls
                for body in _deltas(parser.feed(delta.text), before):
                    yield chunk(body)
            elif delta.text:
                yield chunk({"content": delta.text})
            delta = await anext(deltas, None)
        finished = await gen.finish(await gen.handle.result())
        done = True
        if finished.status == "error":
            yield event(None, openai_body(output_error(finished.output)))
            return
        calls = 0
        if parser is not None:
            before = parser.calls
            for body in _deltas(parser.close(), before):
                yield chunk(body)
            calls = parser.calls
        yield chunk({}, finish_reason(finished.output.finish_reason, tool_calls=calls > 0))
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
