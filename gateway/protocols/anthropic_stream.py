"""Anthropic responses from a Generation: the message body, and the SSE event sequence."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

import structlog

from gateway.generation import Finished, Generation, output_error
from gateway.logs import log_failure
from gateway.protocols.anthropic import (
    AnthropicUsage,
    CacheCreation,
    MessageResponse,
    message_id,
    stop_reason,
)
from gateway.protocols.anthropic_blocks import PING, BlockStream, content_of
from gateway.protocols.cache_diagnostics import Diagnostics
from gateway.protocols.common import cost_number
from gateway.sse import event, keepalive_until_first
from gateway.tools.parse import ToolParsing
from inference.types import TokenDelta
from kvgate.usage import TokenCounts

log = structlog.get_logger("kvgate.gateway")


def usage_of(counts: TokenCounts, finished: Finished | None = None) -> AnthropicUsage:
    return AnthropicUsage(
        input_tokens=counts.input,
        cache_creation_input_tokens=counts.cache_writes,
        cache_read_input_tokens=counts.cache_read,
        # Anthropic's two buckets: writes of the TTL classes under an hour (OpenAI's 30m), and the rest.
        # An Anthropic request only writes 5m and 1h; the others are there so the split always adds up.
        cache_creation=CacheCreation(
            ephemeral_5m_input_tokens=counts.cache_write_5m + counts.cache_write_30m,
            ephemeral_1h_input_tokens=counts.cache_write_1h + counts.cache_write_12h + counts.cache_write_24h,
        ),
        output_tokens=counts.output,
        cost_usd=finished.cost_usd if finished else None,
        cost=cost_number(finished.cost_usd) if finished else None,
    )


def message_of(finished: Finished, *, request_id: str, model: str, tools: ToolParsing | None = None) -> MessageResponse:
    output = finished.output
    content, calls = content_of(output.text, tools)
    return MessageResponse(
        id=message_id(request_id),
        content=content,
        model=model,
        stop_reason=stop_reason(output.finish_reason, output.stop_sequence, tool_use=calls),
        stop_sequence=None if calls else output.stop_sequence,
        usage=usage_of(finished.counts, finished),
    )


async def message_events(
    gen: Generation,
    *,
    request_id: str,
    model: str,
    tools: ToolParsing | None = None,
    diagnostics: Diagnostics | None = None,
) -> AsyncGenerator[bytes, None]:
    """ping (at once, then every few seconds until the first token), message_start (with the cache
    diagnostics, as at Anthropic),
    content_block_start, ping, content_block_delta..., content_block_stop (no block for an
    empty reply), message_delta, message_stop; or an error event if the engine fails mid-stream.
    Blocks open as the output shows what they are (gateway.protocols.anthropic_blocks)."""
    blocks = BlockStream(tools)
    deltas = gen.handle.__aiter__()
    done = False
    try:
        # message_start carries the prompt's cache usage, which is exact once prefill is done (the
        # writes are counted as blocks are committed). Until then the client gets a ping at once
        # and every few seconds, so a long cold prefill is not silence (the SDK skips pings).
        yield PING
        arrived: list[TokenDelta | None] = []
        async with contextlib.aclosing(keepalive_until_first(deltas, arrived, keepalive=PING)) as pings:
            async for ping in pings:
                yield ping
        first = arrived[0]
        counts = gen.early_counts()
        start_usage = usage_of(counts).model_dump(mode="json")
        start_usage["output_tokens"] = max(1, counts.output)
        yield event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id(request_id),
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                    "diagnostics": diagnostics.model_dump(mode="json") if diagnostics else None,
                },
            },
        )
        delta = first
        while delta is not None:
            for block_event in blocks.feed(delta.text):
                yield block_event
            delta = await anext(deltas, None)
        finished = await gen.finish(await gen.handle.result())
        done = True
        if finished.status == "error":
            error = output_error(finished.output)
            yield event("error", {"type": "error", "error": {"type": error.anthropic_type, "message": error.message}})
            return
        output = finished.output
        for block_event in blocks.close():
            yield block_event
        final = usage_of(finished.counts, finished).model_dump(mode="json", exclude={"cache_creation", "service_tier"})
        yield event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": stop_reason(output.finish_reason, output.stop_sequence, tool_use=blocks.saw_calls),
                    "stop_sequence": None if blocks.saw_calls else output.stop_sequence,
                },
                "usage": final,
            },
        )
        yield event("message_stop", {"type": "message_stop"})
    except Exception:
        log_failure(log, "stream_failed", request_id=request_id)
        yield event("error", {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}})
    finally:
        if not done:
            gen.abandon()
