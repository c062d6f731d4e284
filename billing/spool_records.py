"""The spool's settlement records: a priced usage charge as a JSON line, and back.

A settlement that cannot reach the database is written to the spool in this shape and
replayed from it (billing/service.py); the version field lets a newer kvgate refuse a
record it cannot read instead of misreading it.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from billing.ledger import UsageCharge
from billing.prices import PriceVersion
from kvgate.tenancy import UsageRecord
from kvgate.usage import TokenCounts, billed_counts

SPOOL_RECORD_VERSION = 1


async def charge_of_stored_record(session: AsyncSession, charge: UsageCharge) -> UsageCharge:
    """The charge of the usage record already stored under this request id.

    A spooled record loses to one already there (insert-or-ignore), so its settlement
    must too: after a crash, the `interrupted` record recovery spooled and the request's
    own record may both exist, and the ledger bills whichever usage_records kept.
    """
    row = await session.get(UsageRecord, charge.request_id)
    if row is None:
        return charge
    counts = TokenCounts.from_columns(row)
    return UsageCharge(
        request_id=row.request_id,
        tenant_id=row.tenant_id,
        api_key_id=row.api_key_id,
        model=row.model,
        endpoint=row.endpoint,
        status=row.status,
        started_at=row.started_at,
        counts=billed_counts(counts, status=row.status),
        ttft_ms=row.ttft_ms,
        latency_ms=row.latency_ms,
        batch=row.batch,
    )


def spool_record(charge: UsageCharge, version: PriceVersion) -> dict[str, Any]:
    return {
        "v": SPOOL_RECORD_VERSION,
        "kind": "settlement",
        "price_version_id": version.id,
        "request_id": charge.request_id,
        "tenant_id": charge.tenant_id,
        "api_key_id": charge.api_key_id,
        "model": charge.model,
        "endpoint": charge.endpoint,
        "status": charge.status,
        "started_at": charge.started_at.isoformat(),
        "counts": asdict(charge.counts),
        "ttft_ms": charge.ttft_ms,
        "latency_ms": charge.latency_ms,
        "batch": charge.batch,
    }


def jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in values.items()}


def usage_record_values(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "started_at": datetime.fromisoformat(values["started_at"])}


def parse_spool_record(record: dict[str, Any]) -> tuple[UsageCharge, int]:
    if record.get("v") != SPOOL_RECORD_VERSION or record.get("kind") != "settlement":
        raise ValueError(f"unknown spool record {record.get('kind')!r} v{record.get('v')!r}")
    charge = UsageCharge(
        request_id=record["request_id"],
        tenant_id=record["tenant_id"],
        api_key_id=record["api_key_id"],
        model=record["model"],
        endpoint=record["endpoint"],
        status=record["status"],
        started_at=datetime.fromisoformat(record["started_at"]),
        counts=TokenCounts(**record["counts"]),
        ttft_ms=record["ttft_ms"],
        latency_ms=record["latency_ms"],
        batch=bool(record.get("batch", False)),  # records spooled before batches have none
    )
    return charge, int(record["price_version_id"])
