"""Replaying the usage spool into the database: one transaction per tenant, retried on lost races.

A replay that held many tenants' rows in one transaction deadlocked with live settlements
on budget_counters (issue 25); each tenant's records now settle alone, in settle_charges'
lock order, and a lost race is retried (billing.retries) before the round gives up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import spool_records
from billing.ledger import UsageCharge
from billing.metrics import BillingMetrics
from billing.prices import PriceVersion
from billing.retries import retry_conflicts
from billing.settlement import settle_charges
from billing.spool import Spool
from kvgate.db import insert_ignore
from kvgate.db_health import is_database_unavailable, is_transaction_conflict
from kvgate.tenancy import UsageRecord

log = structlog.get_logger("billing.service")


class SpoolReplayer:
    """What Spool.replay calls with each claimed batch of records (apply)."""

    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        spool: Spool,
        metrics: BillingMetrics,
        version_by_id: Callable[[int], Awaitable[PriceVersion]],
        clock: Callable[[], datetime],
    ) -> None:
        self.sessions = sessions
        self.spool = spool
        self.metrics = metrics
        self._version_by_id = version_by_id
        self._clock = clock

    async def apply(self, records: list[dict[str, Any]]) -> int:
        """Settle a batch, one transaction per tenant (a replay holding many tenants' rows at once
        deadlocked with live settlements). A record the database refuses (not merely an outage or a
        lost race) is set aside in the spool's .rejected file rather than retried forever."""
        by_tenant: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            by_tenant.setdefault(str(record.get("tenant_id")), []).append(record)
        applied = 0
        for group in by_tenant.values():
            applied += await self._apply_tenant(group)
        return applied

    async def _apply_tenant(self, records: list[dict[str, Any]]) -> int:
        try:
            return await retry_conflicts(lambda: self._apply_batch(records), what="spool replay")
        except Exception as error:
            # Still unavailable or still losing races: the claimed file stays, the next round redoes it.
            if is_database_unavailable(error) or is_transaction_conflict(error):
                raise
            if len(records) > 1:  # isolate the bad record(s), apply the rest
                return sum([await self._apply_tenant([record]) for record in records])
            await asyncio.to_thread(self.spool.set_aside, records, repr(error))
            self.metrics.replayed.labels(outcome="rejected").inc()
            log.error("billing.spool_record_rejected", record=records[0], error=repr(error))
            return 0

    async def _apply_batch(self, records: list[dict[str, Any]]) -> int:
        """One tenant's records in one transaction, locked in settle_charges' order."""
        charges: list[tuple[UsageCharge, PriceVersion]] = []
        async with self.sessions() as session:
            for record in records:
                charge, version_id = spool_records.parse_spool_record(record)
                version = await self._version_by_id(version_id)
                if "usage_record" in record:
                    inserted = await insert_ignore(
                        session, UsageRecord, spool_records.usage_record_values(record["usage_record"]), ["request_id"]
                    )
                    if not inserted:
                        charge = await spool_records.charge_of_stored_record(session, charge)
                charges.append((charge, version))
            settlements = await settle_charges(session=session, charges=charges, source="spool", now=self._clock())
            await session.commit()
        applied = 0
        for (charge, version), settlement in zip(charges, settlements, strict=True):  # committed: now they count
            self.metrics.settled(charge, version, settlement)
            applied += settlement.inserted
        self.metrics.replayed.labels(outcome="applied").inc(applied)
        self.metrics.replayed.labels(outcome="duplicate").inc(len(records) - applied)
        return applied
