"""Alert tests: billing's migrated throwaway databases (SQLite and PostgreSQL), a real webhook receiver on a
loopback port, and a clock the tests move."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
import uvicorn

from alerts.signing import EVENT_ID_HEADER, SIGNATURE_HEADER, SignatureError, verify
from tests.billing.conftest import db_url, postgres_url, sessions, sqlite_url  # noqa: F401 - fixtures, reused
from tests.gateway.harness import free_port

T0 = datetime(2026, 3, 10, 12, 30, tzinfo=UTC)


class Clock:
    """The time the evaluator and the deliverer see; tests move it."""

    def __init__(self, at: datetime = T0) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **delta: float) -> None:
        self.at += timedelta(**delta)


@dataclass
class Receiver:
    """A webhook receiver as a tenant would write one: it verifies each delivery's signature over the raw body
    with its endpoint's secret (against the test's clock), answers the statuses it is told to, then 200."""

    url: str
    clock: Clock
    secret: str = ""
    statuses: list[int] = field(default_factory=list)
    seen: list[dict[str, object]] = field(default_factory=list)
    """Every request: its event id header, body, and whether its signature verified."""

    @property
    def accepted(self) -> list[dict[str, object]]:
        return [s for s in self.seen if s["verified"] and s["status"] == 200]

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        try:
            verify(headers.get(SIGNATURE_HEADER, ""), body=body, secret=self.secret, now=int(self.clock().timestamp()))
            verified = True
        except SignatureError:
            verified = False
        status = (self.statuses.pop(0) if self.statuses else 200) if verified else 400
        self.seen.append(
            {"event_id": headers.get(EVENT_ID_HEADER), "body": json.loads(body), "verified": verified, "status": status}
        )
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def receiver(clock: Clock) -> AsyncIterator[Receiver]:
    port = free_port()
    hook = Receiver(url=f"http://127.0.0.1:{port}/hooks/kvgate", clock=clock)
    server = uvicorn.Server(uvicorn.Config(hook, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield hook
    finally:
        server.should_exit = True
        await task
