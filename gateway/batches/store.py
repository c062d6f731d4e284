"""Batches in the database: creating, reading, listing and cancelling them per tenant, and the runner's
claims and results. Every read is scoped by tenant: another tenant's id is a 404, as an unknown one."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.batches.models import (
    CANCELED,
    CANCELING,
    ENDED,
    ERRORS,
    EXPIRED,
    IN_PROGRESS,
    OUTPUT,
    PENDING,
    RESULTS,
    RUNNING,
    SUCCEEDED,
    Batch,
    BatchFile,
    BatchItem,
)
from kvgate.db import utcnow
from kvgate.errors import NotFoundError
from kvgate.tenancy import UsageRecord

WINDOW = timedelta(hours=24)  # both APIs' completion window


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


@dataclass(frozen=True)
class NewItem:
    custom_id: str
    params_json: str


def batch_not_found(batch_id: str) -> NotFoundError:
    return NotFoundError(f"No batch found with id '{batch_id}'.")


async def create_batch(
    sessions: async_sessionmaker[AsyncSession],
    *,
    batch_id: str,
    tenant_id: str,
    api_key_id: str,
    api: str,
    endpoint: str,
    items: Sequence[NewItem],
    input_file_id: str | None = None,
    completion_window: str | None = None,
    metadata: dict[str, str] | None = None,
) -> Batch:
    now = utcnow()
    batch = Batch(
        id=batch_id,
        tenant_id=tenant_id,
        api_key_id=api_key_id,
        api=api,
        endpoint=endpoint,
        status=IN_PROGRESS,
        created_at=now,
        expires_at=now + WINDOW,
        request_count=len(items),
        input_file_id=input_file_id,
        completion_window=completion_window,
        metadata_json=json.dumps(metadata) if metadata else None,
    )
    async with sessions() as session:
        session.add(batch)
        await session.flush()
        rows = [
            {"batch_id": batch_id, "position": i, "custom_id": it.custom_id, "params_json": it.params_json}
            for i, it in enumerate(items)
        ]
        for start in range(0, len(rows), 1000):
            await session.execute(
                BatchItem.__table__.insert(),
                [{**r, "status": PENDING, "attempt": 0} for r in rows[start : start + 1000]],
            )
        if api == "openai":
            for kind in (OUTPUT, ERRORS):
                session.add(
                    BatchFile(
                        id=new_id("file-"),
                        tenant_id=tenant_id,
                        purpose="batch_output",
                        filename=f"{batch_id}_{kind}.jsonl",
                        created_at=now,
                        size=0,
                        batch_id=batch_id,
                        kind=kind,
                    )
                )
        await session.commit()
        await session.refresh(batch)
    return batch


async def get_batch(session: AsyncSession, *, tenant_id: str, batch_id: str, api: str) -> Batch:
    batch = await session.get(Batch, batch_id)
    if batch is None or batch.tenant_id != tenant_id or batch.api != api:
        raise batch_not_found(batch_id)
    return batch


async def item_counts(session: AsyncSession, batch_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Items by result, and "processing" (pending or running), per batch."""
    counts: dict[str, dict[str, int]] = {b: {} for b in batch_ids}
    if not batch_ids:
        return counts
    rows = await session.execute(
        select(BatchItem.batch_id, BatchItem.status, func.count())
        .where(BatchItem.batch_id.in_(batch_ids))
        .group_by(BatchItem.batch_id, BatchItem.status)
    )
    for batch_id, status, n in rows.all():
        key = status if status in RESULTS else "processing"
        counts[batch_id][key] = counts[batch_id].get(key, 0) + int(n)
    return counts


async def list_batches(
    session: AsyncSession, *, tenant_id: str, api: str, limit: int, after_id: str | None, before_id: str | None
) -> tuple[list[Batch], bool]:
    """Newest first; `after_id` pages to older batches, `before_id` to newer ones. (batches, has_more)."""
    query = select(Batch).where(Batch.tenant_id == tenant_id, Batch.api == api)
    newest_first = True
    for cursor_id, older in ((after_id, True), (before_id, False)):
        if cursor_id is None:
            continue
        cursor = await session.get(Batch, cursor_id)
        if cursor is None or cursor.tenant_id != tenant_id or cursor.api != api:
            raise batch_not_found(cursor_id)
        key = (cursor.created_at, cursor.id)
        if older:
            query = query.where(or_(Batch.created_at < key[0], and_(Batch.created_at == key[0], Batch.id < key[1])))
        else:
            query = query.where(or_(Batch.created_at > key[0], and_(Batch.created_at == key[0], Batch.id > key[1])))
            newest_first = False
    order = (Batch.created_at.desc(), Batch.id.desc()) if newest_first else (Batch.created_at, Batch.id)
    rows = list((await session.scalars(query.order_by(*order).limit(limit + 1))).all())
    has_more = len(rows) > limit
    rows = rows[:limit]
    if not newest_first:
        rows.reverse()
    return rows, has_more


async def cancel_batch(sessions: async_sessionmaker[AsyncSession], *, tenant_id: str, batch_id: str, api: str) -> None:
    """Ask a batch to stop: items not started end as canceled (the runner finishes it); items running finish."""
    async with sessions() as session:
        batch = await get_batch(session, tenant_id=tenant_id, batch_id=batch_id, api=api)
        if batch.status == IN_PROGRESS:
            batch.status = CANCELING
            batch.cancel_requested_at = utcnow()
            await session.commit()


async def delete_batch(session: AsyncSession, batch: Batch) -> None:
    """An ended batch and its items and files (explicitly: SQLite may not enforce the cascades)."""
    await session.execute(delete(BatchItem).where(BatchItem.batch_id == batch.id))
    await session.execute(delete(BatchFile).where(BatchFile.batch_id == batch.id))
    await session.delete(batch)
    await session.commit()


# -- the runner's side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    batch_id: str
    position: int
    api: str
    endpoint: str
    tenant_id: str
    api_key_id: str
    custom_id: str
    params_json: str
    request_id: str
    previous_request_id: str | None


def attempt_id(batch_id: str, position: int, attempt: int) -> str:
    return f"{batch_id}_{position}_{attempt}"


async def settle_batches(sessions: async_sessionmaker[AsyncSession], now: datetime) -> None:
    """Batches past their window expire what has not started; canceling ones cancel it; batches with nothing
    left to run end."""
    async with sessions() as session:
        active = (await session.scalars(select(Batch).where(Batch.status.in_((IN_PROGRESS, CANCELING))))).all()
        for batch in active:
            kind = CANCELED if batch.status == CANCELING else EXPIRED if batch.expires_at <= now else None
            if kind is not None:
                from gateway.batches.shapes import ended_result

                await session.execute(
                    update(BatchItem)
                    .where(BatchItem.batch_id == batch.id, BatchItem.status == PENDING)
                    .values(status=kind, finished_at=now, result_json=json.dumps(ended_result(batch.api, kind)))
                )
            left = await session.scalar(
                select(func.count())
                .select_from(BatchItem)
                .where(BatchItem.batch_id == batch.id, BatchItem.status.in_((PENDING, RUNNING)))
            )
            if not left:
                batch.status = ENDED
                batch.ended_at = now
        await session.commit()


async def reclaim_interrupted(sessions: async_sessionmaker[AsyncSession]) -> int:
    """Items whose attempt was recorded `interrupted` (crash recovery at start-up found it in the in-flight
    journal: its process is gone) wait again at once, not when their lease runs out."""
    interrupted = select(UsageRecord.request_id).where(UsageRecord.status == "interrupted")
    async with sessions() as session:
        result = await session.execute(
            update(BatchItem)
            .where(BatchItem.status == RUNNING, BatchItem.request_id.in_(interrupted))
            .values(status=PENDING, lease_until=None)
            .execution_options(synchronize_session=False)
        )
        await session.commit()
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def claim_items(
    sessions: async_sessionmaker[AsyncSession], *, limit: int, now: datetime, lease_s: float
) -> list[Claim]:
    """Up to `limit` items to run, taken round robin across the oldest batches in progress: waiting items,
    and items whose runner's lease ran out (a process that died). Each claim is a compare-and-set, so two
    gateways never take one item."""
    if limit <= 0:
        return []
    claimable = or_(BatchItem.status == PENDING, and_(BatchItem.status == RUNNING, BatchItem.lease_until < now))
    async with sessions() as session:
        rows = (
            await session.execute(
                select(BatchItem, Batch)
                .join(Batch, Batch.id == BatchItem.batch_id)
                .where(Batch.status == IN_PROGRESS, claimable)
                .order_by(Batch.created_at, BatchItem.position)
                .limit(limit * 8)
            )
        ).all()
        by_batch: dict[str, list[tuple[BatchItem, Batch]]] = {}
        for item, batch in rows:
            by_batch.setdefault(batch.id, []).append((item, batch))
        order: list[tuple[BatchItem, Batch]] = []
        while len(order) < len(rows):
            for queue in by_batch.values():
                if queue:
                    order.append(queue.pop(0))
        claims: list[Claim] = []
        for item, batch in order:
            if len(claims) == limit:
                break
            previous_request_id, attempt = item.request_id, item.attempt + 1  # before the update refreshes `item`
            request_id = attempt_id(batch.id, item.position, attempt)
            taken = await session.execute(
                update(BatchItem)
                .where(BatchItem.batch_id == item.batch_id, BatchItem.position == item.position)
                .where(BatchItem.attempt == attempt - 1, claimable)
                .values(
                    status=RUNNING, attempt=attempt, request_id=request_id, lease_until=now + timedelta(seconds=lease_s)
                )
            )
            if taken.rowcount != 1:  # type: ignore[attr-defined]
                continue
            claims.append(
                Claim(
                    batch_id=batch.id,
                    position=item.position,
                    api=batch.api,
                    endpoint=batch.endpoint,
                    tenant_id=batch.tenant_id,
                    api_key_id=batch.api_key_id,
                    custom_id=item.custom_id,
                    params_json=item.params_json,
                    request_id=request_id,
                    previous_request_id=previous_request_id,
                )
            )
        await session.commit()
    return claims


async def recorded_status(sessions: async_sessionmaker[AsyncSession], request_id: str) -> str | None:
    """The status of a request's usage record, or None if it has none."""
    async with sessions() as session:
        return await session.scalar(select(UsageRecord.status).where(UsageRecord.request_id == request_id))


async def save_result(
    sessions: async_sessionmaker[AsyncSession], claim: Claim, *, status: str, result: dict[str, object]
) -> None:
    async with sessions() as session:
        await session.execute(
            update(BatchItem)
            .where(BatchItem.batch_id == claim.batch_id, BatchItem.position == claim.position)
            .where(BatchItem.request_id == claim.request_id)
            .values(status=status, result_json=json.dumps(result), finished_at=utcnow(), lease_until=None)
        )
        await session.commit()


async def release(sessions: async_sessionmaker[AsyncSession], claims: Sequence[Claim]) -> None:
    """Hand claimed items back (the runner stops, or the engine is busy): they wait to be run again."""
    await _update_running(sessions, claims, status=PENDING, lease_until=None)


async def renew_leases(sessions: async_sessionmaker[AsyncSession], claims: Sequence[Claim], until: datetime) -> None:
    await _update_running(sessions, claims, lease_until=until)


async def _update_running(sessions: async_sessionmaker[AsyncSession], claims: Sequence[Claim], **values: Any) -> None:
    """Set `values` on each claimed item still running under its claim's attempt (one transaction)."""
    async with sessions() as session:
        for claim in claims:
            await session.execute(
                update(BatchItem)
                .where(BatchItem.batch_id == claim.batch_id, BatchItem.position == claim.position)
                .where(BatchItem.request_id == claim.request_id, BatchItem.status == RUNNING)
                .values(**values)
            )
        await session.commit()


# -- results and files --------------------------------------------------------------------------------


async def result_lines(
    sessions: async_sessionmaker[AsyncSession], batch: Batch, *, only: str | None = None
) -> AsyncIterator[str]:
    """The batch's result lines in request order, read in pages; `only`: OUTPUT (succeeded) or ERRORS."""
    from gateway.batches.shapes import result_line

    position = -1
    while True:
        async with sessions() as session:
            query = (
                select(BatchItem.position, BatchItem.custom_id, BatchItem.status, BatchItem.result_json)
                .where(BatchItem.batch_id == batch.id, BatchItem.position > position)
                .where(BatchItem.result_json.is_not(None))
                .order_by(BatchItem.position)
                .limit(500)
            )
            if only == OUTPUT:
                query = query.where(BatchItem.status == SUCCEEDED)
            elif only == ERRORS:
                query = query.where(BatchItem.status != SUCCEEDED)
            rows = (await session.execute(query)).all()
        if not rows:
            return
        for pos, custom_id, _, result_json in rows:
            yield result_line(batch.api, batch_id=batch.id, position=pos, custom_id=custom_id, result_json=result_json)
        position = rows[-1][0]


async def get_file(session: AsyncSession, *, tenant_id: str, file_id: str) -> BatchFile:
    row = await session.get(BatchFile, file_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFoundError(f"No such File object: {file_id}")
    return row


async def output_files(session: AsyncSession, batch_id: str) -> dict[str, BatchFile]:
    rows = (await session.scalars(select(BatchFile).where(BatchFile.batch_id == batch_id))).all()
    return {row.kind: row for row in rows}
