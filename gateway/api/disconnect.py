"""Noticing that the client of a non-streaming request went away, so its generation can stop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")

# nginx's status for a request whose client closed the connection; it is only logged.
CLIENT_CLOSED_REQUEST = 499


class ClientGone(Exception):
    """The client closed the connection before its response was ready."""


async def until_disconnected(receive: Receive) -> None:
    """Return once the client has gone; call only after the request body has been read."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(work: Coroutine[Any, Any, T], receive: Receive) -> T:
    """Await `work`; if the client leaves first, cancel it and raise ClientGone.

    Cancelling a generation's complete() abandons it: the engine stops at its next
    step and the usage is recorded as cancelled, with what was computed.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(_consume)
    raise ClientGone


def _consume(task: asyncio.Future[Any]) -> None:
    # Nobody awaits the abandoned work any more; its outcome must not be reported as lost.
    if not task.cancelled():
        task.exception()
