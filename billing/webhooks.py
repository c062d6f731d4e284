"""Stripe webhooks: verify the signature, store each event once under (source, event id), apply it.

Claiming the event (insert-or-ignore) and applying it happen in one transaction,
so a redelivered or concurrently delivered event is applied exactly once, and a
failure while applying leaves it unclaimed for Stripe's retry.
"""

from __future__ import annotations

import json
import re
from typing import Any

import stripe
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing.errors import BillingDomainError
from billing.invoices import InvoiceStateError, set_payment_status
from billing.models import Invoice, WebhookEvent
from kvgate.db import insert_ignore, utcnow

SOURCE = "stripe"
PAID_EVENTS = frozenset({"invoice.paid", "invoice.payment_succeeded"})
FAILED_EVENTS = frozenset({"invoice.payment_failed"})
VOIDED_EVENTS = frozenset({"invoice.voided"})


# Stripe's ids are short ASCII; anything longer or stranger is not a Stripe event.
MAX_ID_LENGTH = 128  # webhook_events.event_id is VARCHAR(128)


class WebhookSignatureError(BillingDomainError, ValueError):
    """The request is not a Stripe event signed with our secret (a 400)."""


class WebhookPayloadError(WebhookSignatureError):
    """Signed, but not an event we can store (a 400)."""


def verify(*, payload: bytes, signature: str, secret: str, tolerance_s: int = 300) -> dict[str, Any]:
    """The event, if the Stripe-Signature header proves it came from Stripe with our endpoint secret."""
    try:
        stripe.WebhookSignature.verify_header(payload.decode("utf-8"), signature, secret, tolerance_s)
    except (stripe.SignatureVerificationError, UnicodeDecodeError) as exc:
        raise WebhookSignatureError(f"invalid Stripe signature: {exc}") from exc
    try:
        event = json.loads(payload)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise WebhookPayloadError("the signed payload is not JSON") from exc
    if not isinstance(event, dict):
        raise WebhookPayloadError("the payload is not a Stripe event: expected a JSON object")
    for field in ("id", "type"):
        if not _is_plain_id(event.get(field)):
            raise WebhookPayloadError(
                f"the payload is not a Stripe event: {field!r} must be a printable string of 1 to "
                f"{MAX_ID_LENGTH} characters"
            )
    return event


def _is_plain_id(value: Any) -> bool:
    # Printable excludes NUL (which PostgreSQL text cannot hold) and lone surrogates (which no
    # database driver can encode).
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()


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
                "event_id": event["id"],
                "event_type": event["type"],
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
            .where(WebhookEvent.source == SOURCE, WebhookEvent.event_id == event["id"])
            .values(outcome=outcome[:200])
        )
        await session.commit()
    return outcome


async def _apply(session: AsyncSession, event: dict[str, Any]) -> str:
    kind = event["type"]
    if kind not in PAID_EVENTS | FAILED_EVENTS | VOIDED_EVENTS:
        return "ignored"
    data = event.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    if not isinstance(obj, dict):
        return "ignored: no invoice object"
    invoice_id = await _our_invoice(session, obj)
    if invoice_id is None:
        return "unknown invoice"
    try:
        invoice = await set_payment_status(
            session=session, invoice_id=invoice_id, paid=kind in PAID_EVENTS, at=utcnow(), voided=kind in VOIDED_EVENTS
        )
    except InvoiceStateError as exc:
        return f"refused: {exc}"
    return f"invoice {invoice_id} {invoice.status}"


# Our invoice ids are 64-bit integers, written in ASCII digits.
_INVOICE_ID = re.compile(r"[0-9]{1,18}")


async def _our_invoice(session: AsyncSession, obj: dict[str, Any]) -> int | None:
    stripe_id = obj.get("id")
    if _is_plain_id(stripe_id):
        found = await session.scalar(select(Invoice.id).where(Invoice.stripe_invoice_id == stripe_id))
        if found is not None:
            return found
    metadata = obj.get("metadata")
    ours = metadata.get("kvgate_invoice_id") if isinstance(metadata, dict) else None
    if isinstance(ours, str) and _INVOICE_ID.fullmatch(ours):
        return await session.scalar(select(Invoice.id).where(Invoice.id == int(ours)))
    return None
