"""What the routes share: the engine, its metrics, and the watchers of requests in flight."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import structlog
from fastapi import Request

from inference.async_engine import AsyncEngine, RequestHandle
from inference.metrics import EngineMetrics
from inference.server.drain import Drain

log = structlog.get_logger(__name__)


@dataclass
class ServerState:
    engine: AsyncEngine
    metrics: EngineMetrics
    drain: Drain = field(default_factory=Drain)
    _watchers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def in_flight(self) -> int:
        """Requests submitted to the engine and not finished yet."""
        return len(self._watchers)

    async def wait_idle(self) -> None:
        """Return once no request is in flight (including any submitted while waiting)."""
        while self._watchers:
            await asyncio.wait(set(self._watchers))

    def watch(self, handle: RequestHandle) -> None:
        """Record the request's metrics and log it when it finishes, however its response ends."""
        task = asyncio.create_task(self._finished(handle))
        # The loop keeps only weak references to tasks; hold it until it is done.
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _finished(self, handle: RequestHandle) -> None:
        output = await handle.result()
        self.metrics.record(output)
        usage = output.usage
        log.info(
            "request_finished",
            request_id=output.request_id,
            finish_reason=output.finish_reason,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            completion_tokens=usage.completion_tokens,
            ttft_s=None if output.ttft_s is None else round(output.ttft_s, 4),
            latency_s=round(output.latency_s, 4),
            error=output.error,
        )


def server_state(request: Request) -> ServerState:
    return request.app.state.kvgate
