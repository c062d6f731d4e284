"""Server-sent events, and noticing a client that leaves so its request stops using the engine.

A client that disconnects must not keep its request decoding and holding KV blocks.
Both paths watch the connection while they wait on the engine, not only when a write
fails, because a long prefill can run for seconds without anything to write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import anyio
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from inference.async_engine import RequestHandle
from inference.server.errors import error_body
from inference.server.outputs import OutputFormat, ResponseContext, usage_info
from inference.types import RequestOutput

DONE = b"data: [DONE]\n\n"


def sse(body: BaseModel) -> bytes:
    return b"data: " + body.model_dump_json().encode() + b"\n\n"


def failure(output: RequestOutput) -> tuple[int, str]:
    """The status and message for a request that ended without output of its own making."""
    if output.finish_reason == "cancelled":
        return 503, "the request was cancelled: the engine is shutting down"
    message = output.error or "the engine failed on this request"
    return {"invalid_request": 400, "unavailable": 503}.get(output.error_kind or "", 500), message


async def events(
    handle: RequestHandle, fmt: OutputFormat, ctx: ResponseContext, include_usage: bool, continuous_usage: bool = False
) -> AsyncIterator[bytes]:
    """The SSE chunks of one streamed response, ending with [DONE]; an engine failure is an error chunk.

    continuous_usage: each text chunk carries the usage so far, prompt cache accounting included (the
    engine sets it before the first delta), and completion_tokens counting the tokens of the text sent
    up to and with that chunk.
    """
    try:
        if (opening := fmt.opening(ctx)) is not None:
            yield sse(opening)
        completion_tokens = 0
        async for delta in handle:
            completion_tokens += len(delta.token_ids)
            if delta.text:
                chunk = fmt.text(ctx, delta.text)
                if continuous_usage and handle.prompt_usage is not None:
                    so_far = replace(handle.prompt_usage, completion_tokens=completion_tokens)
                    chunk = chunk.model_copy(update={"usage": usage_info(so_far)})
                yield sse(chunk)
        output = await handle.result()
        if output.finish_reason in ("stop", "length"):
            finish = fmt.finish(ctx, output)
            if continuous_usage:  # as vLLM: the finish chunk carries the usage too
                finish = finish.model_copy(update={"usage": usage_info(output.usage)})
            yield sse(finish)
            if include_usage:
                yield sse(fmt.usage(ctx, output.usage))
        else:
            yield sse(error_body(*failure(output)))
        yield DONE
    finally:
        handle.cancel()  # a no-op once finished; otherwise the client left mid-stream


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStreamResponse(Response):
    """Streams SSE chunks, stopping (and closing the generator) as soon as the client disconnects."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stream() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            async with anyio.create_task_group() as group:

                async def run(func: Callable[[], Awaitable[None]]) -> None:
                    with contextlib.suppress(OSError):  # the client is gone
                        await func()
                    group.cancel_scope.cancel()

                group.start_soon(run, stream)
                group.start_soon(run, lambda: wait_for_disconnect(receive))
        finally:
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()


async def result_unless_disconnected(handle: RequestHandle, request: Request) -> RequestOutput | None:
    """The final output, or None (with the request cancelled) if the client left first."""
    result = asyncio.ensure_future(handle.result())
    gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not result.done():
            result.cancel()
            handle.cancel()
    # A cancelled task is not done until the loop runs it again: test done(), not cancelled().
    return result.result() if result.done() else None
