"""Hourly usage rollups: the ledger summed as it is written, so summaries never scan a month of entries.

`add_entry` runs in the ledger writer's transaction, right after an entry was inserted (never for a
duplicate), so a rollup row always equals the sum of its ledger entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from billing.models import UsageRollup
from kvgate.db import dialect_insert
from kvgate.usage import EntryKind, TokenCounts

# The token columns in TokenCounts' field order (so their sums make TokenCounts(*sums[:TOKEN_SUMS])), then the costs.
TOKEN_SUMS = len(TokenCounts().as_columns())
ROLLUP_SUMS = (*TokenCounts().as_columns(), "cost_pico", "uncached_cost_pico")
# The rollup's key for an entry without an API key (primary key columns cannot be NULL).
NO_KEY = ""


def hour_of(moment: datetime) -> datetime:
    """The UTC hour an entry is rolled up under."""
    return moment.replace(minute=0, second=0, microsecond=0)


async def add_entry(session: AsyncSession, entry: Mapping[str, Any]) -> None:
    """Add one just-inserted ledger entry (its column values) to its hour's rollup row."""
    values = {
        "tenant_id": entry["tenant_id"],
        "hour": hour_of(entry["started_at"]),
        "api_key_id": entry["api_key_id"] or NO_KEY,
        "model": entry["model"],
        "endpoint": entry["endpoint"],
        "status": entry["status"],
        "requests": 1 if entry["kind"] == EntryKind.USAGE else 0,
        **{name: entry[name] for name in ROLLUP_SUMS},
    }
    insert = dialect_insert(session.bind.dialect.name if session.bind is not None else "sqlite")
    statement = insert(UsageRollup).values(**values)
    summed = ("requests", *ROLLUP_SUMS)
    added = {name: getattr(UsageRollup, name) + getattr(statement.excluded, name) for name in summed}
    statement = statement.on_conflict_do_update(
        index_elements=["tenant_id", "hour", "api_key_id", "model", "endpoint", "status"], set_=added
    )
    await session.execute(statement)
