"""Stripe webhooks: verify the signature, store each event once under (source, event id), apply it.

Claiming the event (insert-or-ignore) and applying it happen in one transaction,
so a redelivered or concurrently delivered event is applied exactly once, and a
failure while applying leaves it unclaimed for Stripe's retry.
"""

from __future__ import annotations

import json
from typing import Any

import stripe
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing.invoices import InvoiceStateError, set_payment_status
from billing.models import Invoice, WebhookEvent
from kvgate.db import insert_ignore, utcnow
from kvgate.errors import InvalidRequestError

SOURCE = "stripe"
PAID_EVENTS = frozenset({"invoice.paid", "invoice.payment_succeeded"})
FAILED_EVENTS = frozenset({"invoice.payment_failed"})


class WebhookSignatureError(InvalidRequestError, ValueError):
    pass


def verify(*, payload: bytes, signature: str, secret: str, tolerance_s: int = 300) -> dict[str, Any]:
    """The event, if the Stripe-Signature header proves it came from Stripe with our endpoint secret."""
    try:
        stripe.WebhookSignature.verify_header(payload.decode("utf-8"), signature, secret, tolerance_s)
    except (stripe.SignatureVerificationError, UnicodeDecodeError) as exc:
        raise WebhookSignatureError(f"invalid Stripe signature: {exc}") from exc
    try:
        event = json.loads(payload)
    except ValueError as exc:
        raise WebhookSignatureError("the signed payload is not JSON") from exc
    if not isinstance(event, dict) or not isinstance(event.get("id"), str) or not isinstance(event.get("type"), str):
        raise WebhookSignatureError("the payload is not a Stripe event")
    return event


async def handle_stripe_webhook(
    *, sessions: async_sessionmaker[AsyncSession], payload: bytes, signature: str, secret: str
) -> str:
    event = verify(payload=payload, signature=signature, secret=secret)
    async with sessions() as session:
        claimed = await insert_ignore(
            session,
            WebhookEvent,
            {
                "source": SOURCE,
                "event_id": event["id"][:128],
                "event_type": event["type"][:128],
                "payload": payload.decode("utf-8"),
                "outcome": "received",
                "received_at": utcnow(),
            },
            ["source", "event_id"],
        )
        if not claimed:
            return "duplicate"
        outcome = await _apply(session, event)
        await session.execute(
            update(WebhookEvent)
            .where(WebhookEvent.source == SOURCE, WebhookEvent.event_id == event["id"][:128])
            .values(outcome=outcome[:200])
        )
        await session.commit()
    return outcome


async def _apply(session: AsyncSession, event: dict[str, Any]) -> str:
    kind = event["type"]
    if kind not in PAID_EVENTS | FAILED_EVENTS:
        return "ignored"
    obj = (event.get("data") or {}).get("object") or {}
    invoice_id = await _our_invoice(session, obj)
    if invoice_id is None:
        return "unknown invoice"
    try:
        invoice = await set_payment_status(
            session=session, invoice_id=invoice_id, paid=kind in PAID_EVENTS, at=utcnow()
        )
    except InvoiceStateError as exc:
        return f"refused: {exc}"
    return f"invoice {invoice_id} {invoice.status}"


async def _our_invoice(session: AsyncSession, obj: dict[str, Any]) -> int | None:
    stripe_id = obj.get("id")
    if isinstance(stripe_id, str):
        found = await session.scalar(select(Invoice.id).where(Invoice.stripe_invoice_id == stripe_id))
        if found is not None:
            return found
    ours = (obj.get("metadata") or {}).get("kvgate_invoice_id")
    if isinstance(ours, str) and ours.isdigit():
        found = await session.scalar(select(Invoice.id).where(Invoice.id == int(ours)))
        return found
    return None
