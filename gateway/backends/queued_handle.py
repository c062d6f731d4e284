"""A Handle fed by a background task: deltas through a queue, the final output through a future.

The remote backends (gateway.backends.http, gateway.backends.pool) produce a request's output in
a task of their own; this is the Handle side of that: iterate for deltas, await result().
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

from gateway.backends.base import Placement
from inference.types import ErrorKind, FinishReason, RequestOutput, TokenDelta, Usage


class QueuedHandle:
    """Subclasses implement _run() -> RequestOutput and call _emit(delta); start() runs it.

    A _run() cancelled (cancel()) ends "cancelled" with _usage_so_far(); one that raises ends "error".
    """

    def __init__(self, request_id: str, prompt_token_ids: tuple[int, ...]) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.prompt_usage: Usage | None = None
        self.placement: Placement | None = None
        self._deltas: asyncio.Queue[TokenDelta | None] = asyncio.Queue()
        self._result: asyncio.Future[RequestOutput] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.get_running_loop().time()
        self._text: list[str] = []

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._main(), name=f"request-{self.request_id}")
        self._task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        # A task cancelled before its first step never runs _main's handlers: end the request here.
        if not self._result.done():
            self._result.set_result(self.output("cancelled"))
            self._deltas.put_nowait(None)

    async def _run(self) -> RequestOutput:
        raise NotImplementedError

    def _usage_so_far(self) -> Usage:
        return self.prompt_usage or Usage(len(self.prompt_token_ids), 0, 0, 0)

    async def _main(self) -> None:
        try:
            output = await self._run()
        except asyncio.CancelledError:
            output = self.output("cancelled")
        except Exception as exc:  # a bug here must still end the request, never hang it
            output = self.output("error", error=f"the gateway failed on this request: {exc!r}", kind="internal")
        if not self._result.done():
            self._result.set_result(output)
        self._deltas.put_nowait(None)

    def _emit(self, delta: TokenDelta) -> None:
        self._text.append(delta.text)
        self._deltas.put_nowait(delta)

    @property
    def elapsed_s(self) -> float:
        return asyncio.get_running_loop().time() - self._started

    def output(
        self,
        finish_reason: FinishReason,
        *,
        usage: Usage | None = None,
        error: str | None = None,
        kind: ErrorKind | None = None,
        stop_sequence: str | None = None,
        ttft_s: float | None = None,
    ) -> RequestOutput:
        """This request's output now: the text emitted so far, and the given usage or the usage so far."""
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=(),  # remote engines send text; the gateway never needs the ids
            text="".join(self._text),
            finish_reason=finish_reason,
            usage=usage or self._usage_so_far(),
            stop_sequence=stop_sequence,
            ttft_s=ttft_s,
            latency_s=self.elapsed_s,
            error=error,
            error_kind=kind,
        )

    def relayed(self, output: RequestOutput, *, started_after_s: float) -> RequestOutput:
        """An inner handle's output as this handle's: its id, its text, and times from this handle's start
        (the inner one started started_after_s later, after any engines that failed first)."""
        ttft_s = None if output.ttft_s is None else output.ttft_s + started_after_s
        return replace(
            output, request_id=self.request_id, text="".join(self._text), ttft_s=ttft_s, latency_s=self.elapsed_s
        )

    @property
    def started_at(self) -> float:
        return self._started

    async def __aiter__(self) -> AsyncIterator[TokenDelta]:
        while (delta := await self._deltas.get()) is not None:
            yield delta
        self._deltas.put_nowait(None)  # a second iteration ends at once too

    async def result(self) -> RequestOutput:
        return await asyncio.shield(self._result)

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
