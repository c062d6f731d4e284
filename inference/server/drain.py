"""Draining an engine server: stop taking requests, finish those in flight, then exit (KV write-out).

POST /drain starts it. From then on:
- GET /health answers 503 with the message "draining", so the gateways' engine pools stop
  routing to this engine at their next health check;
- a new generation request gets 503 (a gateway fails it over to another engine before its
  first token);
- requests already in flight run to their end as usual;
- once none is left (or `timeout_s` after the drain began, if given), the server exits as on
  SIGTERM: the engine stops and the device pool and host tier are written out to the disk
  tier (KVGATE_KV_DISK_WRITE_OUT_ON_CLOSE), so a restart on the same disk keeps them.
GET /drain reports the progress (inference/server/drain_routes.py). `kvgate engine drain URL`
does both.

Who may drain: with KVGATE_DRAIN_TOKEN set, whoever sends it as a bearer token; without it,
only clients on the loopback interface (an engine bound to other addresses should set it).

The exit is whatever the runner installs as `Drain.exit` (`kvgate engine serve` sets its
uvicorn server's should_exit); an app run otherwise stays up, refusing work, once drained.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import structlog

from inference.server.auth import token_matches

if TYPE_CHECKING:
    from inference.server.state import ServerState

log = structlog.get_logger(__name__)

DRAINING = "draining"


class DrainStatus(NamedTuple):
    draining: bool
    in_flight: int
    drained: bool  # nothing left in flight: the server is exiting (or, with no exit installed, idle)
    elapsed_s: float | None


class Drain:
    """One engine server's drain state; `exit` is called once it is drained."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.drained = False
        self.exit: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def begin(self, state: ServerState, *, timeout_s: float | None = None) -> None:
        """Start draining (again: nothing changes)."""
        if self.started_at is not None:
            return
        self.started_at = time.monotonic()
        log.info("engine_draining", in_flight=state.in_flight, timeout_s=timeout_s)
        self._task = asyncio.get_running_loop().create_task(self._finish(state, timeout_s))

    async def _finish(self, state: ServerState, timeout_s: float | None) -> None:
        try:
            await asyncio.wait_for(state.wait_idle(), timeout_s)
        except TimeoutError:
            log.warning("engine_drain_timed_out", in_flight=state.in_flight, timeout_s=timeout_s)
        self.drained = True
        log.info("engine_drained", exiting=self.exit is not None)
        if self.exit is not None:
            self.exit()

    def status(self, state: ServerState) -> DrainStatus:
        elapsed = None if self.started_at is None else time.monotonic() - self.started_at
        return DrainStatus(self.draining, state.in_flight, self.drained, elapsed)


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def may_drain(*, client_host: str | None, authorization: str | None, token: str | None) -> bool:
    """With a token configured, whoever presents it; without, loopback clients only."""
    if token:
        return token_matches(authorization, token)
    return is_loopback(client_host)
