"""The alerts' rows: a tenant's settings and endpoints, firing an alert (once per tenant, kind and period,
with one delivery per target in the same transaction), claiming due deliveries and logging attempts."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from alerts.kinds import parse_kinds
from alerts.models import AlertAttempt, AlertDelivery, AlertEndpoint, AlertEvent, AlertSettingsRow
from alerts.rules import Fired
from alerts.signing import new_secret
from alerts.urls import check_webhook_url
from kvgate.db import insert_ignore, utcnow
from kvgate.errors import InvalidRequestError

WEBHOOK = "webhook"
EMAIL = "email"
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
MAX_RECIPIENTS = 20
MAX_ENDPOINTS = 10


@dataclass(frozen=True)
class TenantAlerts:
    tenant_id: str
    kinds: tuple[str, ...]
    recipients: tuple[str, ...]
    endpoints: tuple[AlertEndpoint, ...]


def parse_recipients(text: str) -> tuple[str, ...]:
    """Addresses separated by commas, spaces or lines; lower-cased, each checked for one '@' and a dot."""
    found = []
    for raw in text.replace(",", " ").split():
        address = raw.strip().lower()
        local, at, domain = address.partition("@")
        if not at or not local or "." not in domain or "@" in domain or len(address) > 320:
            raise InvalidRequestError(f"not an email address: {raw[:80]}")
        if address not in found:
            found.append(address)
    if len(found) > MAX_RECIPIENTS:
        raise InvalidRequestError(f"at most {MAX_RECIPIENTS} alert recipients")
    return tuple(found)


async def tenant_alerts(session: AsyncSession, tenant_id: str) -> TenantAlerts:
    row = await session.get(AlertSettingsRow, tenant_id)
    endpoints = await session.scalars(
        select(AlertEndpoint)
        .where(AlertEndpoint.tenant_id == tenant_id, AlertEndpoint.removed_at.is_(None))
        .order_by(AlertEndpoint.created_at, AlertEndpoint.id)
    )
    return TenantAlerts(
        tenant_id=tenant_id,
        kinds=parse_kinds(row.kinds) if row else (),
        recipients=tuple(r for r in row.email_recipients.split(",") if r) if row else (),
        endpoints=tuple(endpoints.all()),
    )


async def save_settings(
    session: AsyncSession, *, tenant_id: str, kinds: tuple[str, ...], recipients: tuple[str, ...]
) -> None:
    values = {"kinds": " ".join(parse_kinds(" ".join(kinds))), "email_recipients": ",".join(recipients)}
    if not await insert_ignore(
        session, AlertSettingsRow, {"tenant_id": tenant_id, **values, "updated_at": utcnow()}, ["tenant_id"]
    ):
        await session.execute(
            update(AlertSettingsRow)
            .where(AlertSettingsRow.tenant_id == tenant_id)
            .values(**values, updated_at=utcnow())
        )


async def add_endpoint(
    session: AsyncSession, *, tenant_id: str, url: str, allow_private: bool = False
) -> AlertEndpoint:
    """A new endpoint for a checked URL (InvalidRequestError otherwise); its secret is in the returned row."""
    url = check_webhook_url(url, allow_private=allow_private)
    current = await tenant_alerts(session, tenant_id)
    if len(current.endpoints) >= MAX_ENDPOINTS:
        raise InvalidRequestError(f"at most {MAX_ENDPOINTS} webhook endpoints")
    endpoint = AlertEndpoint(
        id=f"we_{secrets.token_hex(8)}", tenant_id=tenant_id, url=url, secret=new_secret(), created_at=utcnow()
    )
    session.add(endpoint)
    await session.flush()
    return endpoint


async def remove_endpoint(session: AsyncSession, *, tenant_id: str, endpoint_id: str) -> bool:
    """Remove one of the tenant's endpoints (False: no such endpoint in this tenant); its pending deliveries stop."""
    result = await session.execute(
        update(AlertEndpoint)
        .where(
            AlertEndpoint.id == endpoint_id, AlertEndpoint.tenant_id == tenant_id, AlertEndpoint.removed_at.is_(None)
        )
        .values(removed_at=utcnow())
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    await session.execute(
        update(AlertDelivery)
        .where(AlertDelivery.endpoint_id == endpoint_id, AlertDelivery.state == PENDING)
        .values(state=FAILED)
    )
    return True


def event_body(*, event_id: str, tenant_id: str, fired: Fired, created: datetime) -> str:
    """The webhook payload, Stripe-like: an id receivers dedupe on, a type, a creation time and the data."""
    return json.dumps(
        {
            "id": event_id,
            "type": f"alert.{fired.kind}",
            "created": int(created.timestamp()),
            "tenant_id": tenant_id,
            "period": fired.period,
            "summary": fired.summary,
            "data": fired.data,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


async def fire(session: AsyncSession, *, alerts: TenantAlerts, fired: Fired, now: datetime) -> str | None:
    """Store the alert and its deliveries; None if it already fired for this period (nothing is sent again)."""
    event_id = f"evt_{secrets.token_hex(12)}"
    body = event_body(event_id=event_id, tenant_id=alerts.tenant_id, fired=fired, created=now)
    row = {
        "id": event_id,
        "tenant_id": alerts.tenant_id,
        "kind": fired.kind,
        "period": fired.period,
        "summary": fired.summary[:500],
        "body": body,
        "created_at": now,
    }
    if not await insert_ignore(session, AlertEvent, row, ["tenant_id", "kind", "period"]):
        return None
    targets = [(WEBHOOK, e.id, e.url) for e in alerts.endpoints]
    if alerts.recipients:
        targets.append((EMAIL, None, ",".join(alerts.recipients)))
    for channel, endpoint_id, target in targets:
        session.add(
            AlertDelivery(
                event_id=event_id,
                tenant_id=alerts.tenant_id,
                channel=channel,
                endpoint_id=endpoint_id,
                target=target,
                state=PENDING,
                attempts=0,
                next_attempt_at=now,
                created_at=now,
            )
        )
    await session.flush()
    return event_id


async def due_deliveries(session: AsyncSession, *, now: datetime, limit: int) -> list[AlertDelivery]:
    rows = await session.scalars(
        select(AlertDelivery)
        .where(AlertDelivery.state == PENDING, AlertDelivery.next_attempt_at <= now)
        .order_by(AlertDelivery.next_attempt_at, AlertDelivery.id)
        .limit(limit)
    )
    return list(rows.all())


async def claim(session: AsyncSession, delivery: AlertDelivery, *, now: datetime, lease: timedelta) -> bool:
    """Take the next attempt of a delivery: one conditional UPDATE, so two evaluators never send the same attempt."""
    result = await session.execute(
        update(AlertDelivery)
        .where(
            AlertDelivery.id == delivery.id,
            AlertDelivery.state == PENDING,
            AlertDelivery.attempts == delivery.attempts,
        )
        .values(attempts=delivery.attempts + 1, next_attempt_at=now + lease)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def record_attempt(
    session: AsyncSession,
    *,
    delivery_id: int,
    attempt: int,
    started_at: datetime,
    finished_at: datetime,
    status_code: int | None,
    error: str | None,
    next_attempt_at: datetime | None,
) -> None:
    """Log one attempt; the delivery is delivered (no error), retried at next_attempt_at, or failed (None)."""
    session.add(
        AlertAttempt(
            delivery_id=delivery_id,
            attempt=attempt,
            started_at=started_at,
            finished_at=finished_at,
            status_code=status_code,
            error=error[:500] if error else None,
        )
    )
    if error is None:
        values: dict[str, object] = {"state": DELIVERED, "delivered_at": finished_at}
    elif next_attempt_at is None:
        values = {"state": FAILED}
    else:
        values = {"next_attempt_at": next_attempt_at}
    await session.execute(
        update(AlertDelivery)
        .where(AlertDelivery.id == delivery_id, AlertDelivery.state == PENDING)
        .values(**values)
        .execution_options(synchronize_session=False)
    )


@dataclass(frozen=True)
class DeliveryView:
    delivery: AlertDelivery
    event: AlertEvent
    attempts: tuple[AlertAttempt, ...]


async def recent_deliveries(session: AsyncSession, *, tenant_id: str, limit: int = 50) -> list[DeliveryView]:
    """The tenant's latest deliveries with their alert and every attempt, newest first."""
    rows = (
        await session.execute(
            select(AlertDelivery, AlertEvent)
            .join(AlertEvent, AlertEvent.id == AlertDelivery.event_id)
            .where(AlertDelivery.tenant_id == tenant_id)
            .order_by(AlertDelivery.created_at.desc(), AlertDelivery.id.desc())
            .limit(limit)
        )
    ).all()
    ids = [delivery.id for delivery, _ in rows]
    attempts: dict[int, list[AlertAttempt]] = {i: [] for i in ids}
    if ids:
        for attempt in await session.scalars(
            select(AlertAttempt).where(AlertAttempt.delivery_id.in_(ids)).order_by(AlertAttempt.attempt)
        ):
            attempts[attempt.delivery_id].append(attempt)
    return [DeliveryView(delivery, event, tuple(attempts[delivery.id])) for delivery, event in rows]


async def events_of(session: AsyncSession, *, tenant_id: str) -> list[AlertEvent]:
    rows = await session.scalars(
        select(AlertEvent).where(AlertEvent.tenant_id == tenant_id).order_by(AlertEvent.created_at, AlertEvent.id)
    )
    return list(rows.all())
