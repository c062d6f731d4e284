"""Stopping `kvgate serve` within its grace period, whatever state the engine is in.

After SIGTERM, uvicorn stops accepting connections and gives the requests in flight
request_grace_s() to finish; then it cancels them (each still settles: the engine
aborts it, and its usage record holds what was computed). The app's lifespan then
runs shut_down() within the rest of the grace period: every step is bounded, so a
stuck engine, a slow KV write-out or an unreachable database cannot keep the
process alive.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gateway.state import Gateway

log = structlog.get_logger("kvgate.gateway")

# The share of KVGATE_SHUTDOWN_GRACE_S that requests in flight get to finish.
REQUESTS_SHARE = 2 / 3


def request_grace_s(grace_s: float) -> float:
    """How long uvicorn lets requests in flight run after SIGTERM before cancelling them."""
    return grace_s * REQUESTS_SHARE


def cleanup_budget_s(grace_s: float) -> float:
    """How long the lifespan's shutdown may take after that."""
    return grace_s - request_grace_s(grace_s)


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, share: float = 1.0) -> float:
        """A share of the time left (at least a moment, so every step gets its chance)."""
        return max(0.05, (self.end - time.monotonic()) * share)


async def bounded(step: str, work: Awaitable[Any], timeout_s: float) -> None:
    """Await work for at most timeout_s; a step that fails or runs late is logged, and shutdown goes on."""
    try:
        await asyncio.wait_for(work, timeout_s)
    except TimeoutError:
        log.error("shutdown_step_cut_short", step=step, timeout_s=round(timeout_s, 2))
    except Exception:
        log.exception("shutdown_step_failed", step=step)


async def shut_down(gw: Gateway, *, budget_s: float, closers: list[tuple[str, Callable[[], Awaitable[Any]]]]) -> None:
    """Settle what is in flight, stop the engine, then run the closers in order, all within budget_s.

    Order matters: requests cancelled at the end of the request grace settle through the
    engine (it aborts them), so it still runs while they do; if it is stuck, stopping it
    fails them from the event loop, and a second drain records those.
    """
    deadline = Deadline(budget_s)
    await bounded("drain_requests", gw.drain(), deadline.left(0.4))
    await bounded("engine_shutdown", gw.engine.shutdown(timeout_s=deadline.left(0.6)), deadline.left(0.7))
    await bounded("drain_after_engine", gw.drain(), deadline.left(0.4))
    for step, close in closers:
        await bounded(step, close(), deadline.left(0.5))
