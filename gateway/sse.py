"""Server-sent events: encoding, keep-alives while a stream waits, and a response that stops its
generator when the client leaves."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

# While a stream waits for its first token (a cold prefill of a few thousand tokens takes
# seconds on a CPU), something is sent this often, so clients and proxies with read timeouts
# of a few seconds do not give up on a request that is running.
KEEPALIVE_S = 2.0
# An SSE comment: every SSE parser skips it (OpenAI's SDK included).
COMMENT_KEEPALIVE = b": keepalive\n\n"


def event(name: str | None, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), default=str)
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {payload}\n\n".encode()


async def keepalive_until_first(
    items: AsyncIterator[T], first: list[T | None], *, keepalive: bytes, every_s: float | None = None
) -> AsyncGenerator[bytes, None]:
    """Yield `keepalive` every `every_s` seconds (KEEPALIVE_S) until `items` gives its first item
    (None if it ends without one), which is then appended to `first`. Re-raises what it raised."""
    waiting = asyncio.ensure_future(anext(items, None))
    try:
        while not (await asyncio.wait({waiting}, timeout=every_s or KEEPALIVE_S))[0]:
            yield keepalive
        first.append(waiting.result())
    finally:
        # The client left (or the stream was closed) while waiting: stop waiting on the engine.
        waiting.cancel()


class EventStreamResponse(Response):
    """Streams an async generator as text/event-stream.

    Unlike Starlette's StreamingResponse under ASGI 2.4, it watches for the client's
    disconnect while the generator is waiting on the engine (not only when a write
    fails), and always closes the generator, so its cleanup (cancelling the engine
    request, recording usage) runs promptly and exactly once.
    """

    media_type = "text/event-stream"

    def __init__(self, body: AsyncGenerator[bytes, None], *, headers: dict[str, str] | None = None) -> None:
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    try:
                        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                        async for chunk in self.body_iterator:
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                    except OSError:
                        pass  # the client is gone; the generator's cleanup runs below
                    group.cancel_scope.cancel()

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                group.start_soon(watch)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
