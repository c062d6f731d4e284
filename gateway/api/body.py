"""Request bodies the completion routes read themselves: bounded, and prepared off the event loop when large.

FastAPI would parse and validate a body on the event loop before the handler runs
(and before authentication). The completion routes instead authenticate, take
their rate-limit unit, read the body against the model's byte bound, and only then
turn it into engine input (gateway.services.completions): inline when the body is
small, in a worker process (gateway.request_workers) when it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from starlette.requests import Request

from gateway.generation import RequestContext
from gateway.services.completions import PrepareContext
from gateway.state import Gateway
from kvgate.errors import RequestTooLargeError

# Bodies up to this size are prepared on the event loop: a few milliseconds at most
# (8 KiB of the smallest JSON objects validate in about 2 ms), less than a hand-off costs.
INLINE_BODY_BYTES = 8 * 1024

R = TypeVar("R")
Job = Callable[[PrepareContext, bytes, str | None], R]


async def read_body(request: Request, *, limit: int | None) -> bytes:
    """The raw body; 413 as soon as it is known to exceed `limit` (from Content-Length, before reading)."""
    declared = request.headers.get("content-length", "")
    if limit is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if limit is not None and size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> RequestTooLargeError:
    # The connection is closed rather than the rest of the body read and thrown away (about
    # 12 ms of CPU per 30 MB): HTTP clients read an early response when their upload fails.
    return RequestTooLargeError(
        f"request body exceeds {limit} bytes, more than any prompt that fits this model's context can need",
        headers={"connection": "close"},
    )


async def prepare_body(gw: Gateway, *, ctx: RequestContext, request: Request, job: Job[R]) -> R:
    """Read the body and run `job` on it: inline when small, else in a worker process, one per tenant at a time."""
    raw = await read_body(request, limit=gw.prep.renderer.bounds.max_body_bytes)
    return await run_job(gw, ctx=ctx, job=job, raw=raw, content_type=request.headers.get("content-type"))


async def run_job(
    gw: Gateway, *, ctx: RequestContext, job: Job[R], raw: bytes, content_type: str | None, size: int | None = None
) -> R:
    """`job` on a body already read: inline when small (`size`, default the body's), else in a worker process."""
    if (len(raw) if size is None else size) <= INLINE_BODY_BYTES:
        return job(gw.prep, raw, content_type)
    return await gw.workers.run(ctx.principal.tenant_id, job, raw, content_type)
