"""Usage records: one per finished or abandoned request, written behind a small seam.

The gateway builds a UsageEvent when a request ends and hands it to the app's
UsageRecorder (app.state.usage_recorder). The default one inserts into
usage_records, ignoring a request id it has already seen, so a retried write never
counts a request twice. Billing may wrap or replace it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Literal, Protocol

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.models import UsageRecord
from kvgate.db import insert_ignore

UsageStatus = Literal["ok", "cancelled", "error"]
Endpoint = Literal["messages", "chat.completions"]


@dataclass(frozen=True)
class UsageEvent:
    """What one request consumed. Token counts are the engine's, never estimates.

    input_tokens are prompt tokens neither read from nor written to the cache, so
    input + writes + read = the rendered prompt.
    """

    request_id: str
    tenant_id: str
    api_key_id: str
    model: str
    endpoint: Endpoint
    started_at: datetime
    input_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    cache_read_tokens: int
    output_tokens: int
    ttft_ms: int | None
    latency_ms: int
    status: UsageStatus
    cache_write_24h_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return (
            self.input_tokens
            + self.cache_write_5m_tokens
            + self.cache_write_1h_tokens
            + self.cache_write_24h_tokens
            + self.cache_read_tokens
        )


class UsageRecorder(Protocol):
    async def record(self, event: UsageEvent) -> bool:
        """Store the event; False when this request id was already recorded."""
        ...


class DatabaseUsageRecorder:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def record(self, event: UsageEvent) -> bool:
        async with self._sessions() as session:
            inserted = await insert_ignore(session, UsageRecord, asdict(event), ["request_id"])
            await session.commit()
            return inserted
