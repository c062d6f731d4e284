"""Pushing finalized invoices to Stripe: one customer per tenant, one invoice item per line (plus one per tax
line), and each credit note as a Stripe credit note, so Stripe's amount due is kvgate's.

Our ledger is the source of truth; Stripe only receives amounts. Every create
carries an idempotency key derived from our ids (customer: tenant; item: invoice +
line; invoice: invoice), so a retried request is answered with the object Stripe
already made. On top of that, each Stripe id is recorded as soon as it exists and
items are matched by metadata before creating, so a push interrupted anywhere and
run again creates nothing twice, even against a server that ignores idempotency
keys (localstripe does).

Order: pending invoice items first, then the invoice with
pending_invoice_items_behavior=include (which takes them), then finalize, then any credit
notes not yet in Stripe (recorded in stripe_credit_notes, matched by metadata before
creating). The customer's name, email, address and tax IDs are brought up to date from
the tenant's billing profile on every push.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import stripe
import structlog
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing.invoices import DRAFT, VOID, InvoiceStateError, get_invoice, view_invoice
from billing.models import CreditNote, Invoice, InvoiceLineRow, StripeCreditNote, StripeCustomer, StripeInvoiceItem
from billing.profiles import BillingProfile, get_profile
from billing.settings import BillingSettings
from kvgate.db import insert_ignore, utcnow
from kvgate.usage import CATEGORY_LABELS, Category

log = structlog.get_logger(__name__)

_push_locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)


class StripeSyncError(RuntimeError):
    pass


@dataclass(frozen=True)
class PushResult:
    invoice_id: int
    stripe_customer_id: str
    stripe_invoice_id: str
    items_created: int
    items_existing: int
    credit_notes_created: int = 0
    amount_due_cents: int | None = None


def client_from_settings(settings: BillingSettings) -> stripe.StripeClient | None:
    if settings.stripe_api_key is None:
        return None
    base = {"api": settings.stripe_api_base} if settings.stripe_api_base else None
    # Retries are safe: every create below carries an idempotency key.
    return stripe.StripeClient(settings.stripe_api_key.get_secret_value(), base_addresses=base, max_network_retries=2)


def idempotency_key(*parts: object) -> str:
    return "kvgate-" + "-".join(str(p) for p in parts)


async def _call(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    # The SDK's synchronous client, off the event loop.
    return await asyncio.to_thread(fn, *args, **kwargs)


def customer_params(profile: BillingProfile) -> dict[str, Any]:
    """Name, email and address as Stripe's customer takes them (absent fields left out)."""
    params: dict[str, Any] = {"name": profile.legal_name}
    if profile.email:
        params["email"] = profile.email
    if profile.address is not None:
        address = {k: v for k, v in profile.address.__dict__.items() if v}
        params["address"] = address
    return params


async def ensure_customer(
    *, sessions: async_sessionmaker[AsyncSession], client: stripe.StripeClient, tenant_id: str
) -> str:
    """The tenant's Stripe customer, created once and brought up to date with its billing profile."""
    async with sessions() as session:
        row = await session.get(StripeCustomer, tenant_id)
        profile = await get_profile(session=session, tenant_id=tenant_id)
    params = customer_params(profile)
    if row is not None:
        await _call(client.v1.customers.update, row.stripe_customer_id, params=params)
        await _sync_tax_ids(client, row.stripe_customer_id, profile)
        return row.stripe_customer_id
    tax_ids = [{"type": profile.tax_id.type, "value": profile.tax_id.value}] if profile.tax_id else []
    customer = await _call(
        client.v1.customers.create,
        params={**params, "tax_id_data": tax_ids, "metadata": {"kvgate_tenant_id": tenant_id}},
        options={"idempotency_key": idempotency_key("customer", tenant_id)},
    )
    async with sessions() as session:
        inserted = await insert_ignore(
            session,
            StripeCustomer,
            {"tenant_id": tenant_id, "stripe_customer_id": customer.id, "created_at": utcnow()},
            ["tenant_id"],
        )
        await session.commit()
        if not inserted:  # a concurrent push won; keep its customer
            row = await session.get(StripeCustomer, tenant_id)
            assert row is not None
            log.warning(
                "stripe.duplicate_customer", tenant_id=tenant_id, kept=row.stripe_customer_id, extra=customer.id
            )
            return row.stripe_customer_id
    return customer.id


async def _sync_tax_ids(client: stripe.StripeClient, customer_id: str, profile: BillingProfile) -> None:
    """Add the profile's tax ID if the customer lacks it (old ones stay: they may be on issued invoices)."""
    if profile.tax_id is None:
        return
    existing = await _call(client.v1.customers.tax_ids.list, customer_id)
    if any((t.type, t.value) == (profile.tax_id.type, profile.tax_id.value) for t in existing.data):
        return
    await _call(
        client.v1.customers.tax_ids.create,
        customer_id,
        params={"type": profile.tax_id.type, "value": profile.tax_id.value},
    )


def line_description(line: InvoiceLineRow) -> str:
    label = CATEGORY_LABELS[Category(line.category)]
    return f"{line.model} - {label}: {line.tokens:,} tokens at ${line.unit_price_usd_per_mtok}/Mtok"


async def push_due(
    *, sessions: async_sessionmaker[AsyncSession], client: stripe.StripeClient, currency: str = "usd"
) -> list[PushResult]:
    """Catch up: push every finalized invoice not yet in Stripe, and every credit note not yet there."""
    async with sessions() as session:
        unpushed = select(Invoice.id).where(Invoice.status != DRAFT, Invoice.status != VOID)
        unpushed = unpushed.where(Invoice.stripe_invoice_id.is_(None))
        with_new_notes = (
            select(CreditNote.invoice_id)
            .outerjoin(StripeCreditNote, StripeCreditNote.credit_note_id == CreditNote.id)
            .where(StripeCreditNote.credit_note_id.is_(None))
        )
        ids = set((await session.scalars(unpushed)).all()) | set((await session.scalars(with_new_notes)).all())
    return [
        await push_invoice(sessions=sessions, client=client, invoice_id=invoice_id, currency=currency)
        for invoice_id in sorted(ids)
    ]


async def push_invoice(
    *, sessions: async_sessionmaker[AsyncSession], client: stripe.StripeClient, invoice_id: int, currency: str = "usd"
) -> PushResult:
    """Mirror a finalized invoice in Stripe, and its credit notes; running it again pushes only what is new."""
    async with _push_locks[invoice_id]:
        async with sessions() as session:
            invoice = await get_invoice(session=session, invoice_id=invoice_id)
            if invoice.status == DRAFT:
                raise InvoiceStateError(f"invoice {invoice_id} is a draft; only finalized invoices go to Stripe")
            if invoice.status == VOID and invoice.stripe_invoice_id is None:
                raise InvoiceStateError(f"invoice {invoice_id} is void; there is nothing to push")
            tax_lines = (await view_invoice(session=session, invoice_id=invoice_id)).tax_lines
            lines = (
                await session.scalars(
                    select(InvoiceLineRow)
                    .where(InvoiceLineRow.invoice_id == invoice_id)
                    .order_by(InvoiceLineRow.position)
                )
            ).all()
            pushed = {
                row.invoice_line_id: row.stripe_invoice_item_id
                for row in (
                    await session.scalars(
                        select(StripeInvoiceItem).where(StripeInvoiceItem.invoice_line_id.in_([ln.id for ln in lines]))
                    )
                ).all()
            }
        customer_id = await ensure_customer(sessions=sessions, client=client, tenant_id=invoice.tenant_id)
        created = existing = 0
        if invoice.stripe_invoice_id is None:
            # Items a previous, interrupted run created but did not get to record.
            found = await _items_by_line(client, customer_id)
            for line in lines:
                if line.id in pushed:
                    existing += 1
                    continue
                item_id = found.get(str(line.id))
                if item_id is None:
                    item = await _call(
                        client.v1.invoice_items.create,
                        params={
                            "customer": customer_id,
                            "amount": line.amount_cents,
                            "currency": currency,
                            "description": line_description(line),
                            "metadata": {
                                "kvgate_invoice_id": str(invoice_id),
                                "kvgate_invoice_line_id": str(line.id),
                                "kvgate_invoice_number": invoice.number or "",
                            },
                        },
                        options={"idempotency_key": idempotency_key("invoice", invoice_id, "line", line.position)},
                    )
                    item_id = item.id
                    created += 1
                else:
                    existing += 1
                await _record_item(sessions, line.id, item_id)
            for position, tax in enumerate(tax_lines, start=1):
                key = f"tax-{invoice_id}-{position}"
                if key in found:
                    existing += 1
                    continue
                await _call(
                    client.v1.invoice_items.create,
                    params={
                        "customer": customer_id,
                        "amount": tax.amount_cents,
                        "currency": currency,
                        "description": f"{tax.label} on {tax.taxable_cents / 100:.2f}",
                        "metadata": {
                            "kvgate_invoice_id": str(invoice_id),
                            "kvgate_invoice_line_id": key,
                            "kvgate_invoice_number": invoice.number or "",
                        },
                    },
                    options={"idempotency_key": idempotency_key("invoice", invoice_id, "tax", position)},
                )
                created += 1
            ours = {str(line.id) for line in lines} | {f"tax-{invoice_id}-{p}" for p in range(1, len(tax_lines) + 1)}
            expected = sum(line.amount_cents for line in lines) + sum(t.amount_cents for t in tax_lines)
            stripe_invoice_id = await _create_invoice(sessions, client, invoice, customer_id, ours, expected)
        else:
            existing = len(lines)
            stripe_invoice_id = invoice.stripe_invoice_id
        # Also on a re-push: a run that died between creating and finalizing left a Stripe draft.
        await _ensure_finalized(client, stripe_invoice_id, invoice_id)
        notes = await _push_credit_notes(sessions, client, invoice_id, stripe_invoice_id)
        remote = await _call(client.v1.invoices.retrieve, stripe_invoice_id)
        return PushResult(
            invoice_id=invoice_id,
            stripe_customer_id=customer_id,
            stripe_invoice_id=stripe_invoice_id,
            items_created=created,
            items_existing=existing,
            credit_notes_created=notes,
            amount_due_cents=remote.amount_due,
        )


async def _push_credit_notes(
    sessions: async_sessionmaker[AsyncSession], client: stripe.StripeClient, invoice_id: int, stripe_invoice_id: str
) -> int:
    """Each of the invoice's credit notes as a Stripe credit note (pre-payment: it lowers Stripe's amount due)."""
    async with sessions() as session:
        notes = (
            await session.scalars(
                select(CreditNote)
                .outerjoin(StripeCreditNote, StripeCreditNote.credit_note_id == CreditNote.id)
                .where(CreditNote.invoice_id == invoice_id, StripeCreditNote.credit_note_id.is_(None))
                .order_by(CreditNote.id)
            )
        ).all()
    if not notes:
        return 0
    listing = await _call(client.v1.credit_notes.list, params={"invoice": stripe_invoice_id, "limit": 100})
    found = {
        (n.metadata.to_dict() if n.metadata else {}).get("kvgate_credit_note_id"): n.id
        for n in await asyncio.to_thread(lambda: list(listing.auto_paging_iter()))
    }
    created = 0
    for note in notes:
        remote_id = found.get(str(note.id))
        if remote_id is None:
            remote = await _call(
                client.v1.credit_notes.create,
                params={
                    "invoice": stripe_invoice_id,
                    "amount": note.amount_cents,
                    "memo": f"{note.number}: {note.reason}"[:500],
                    "metadata": {"kvgate_credit_note_id": str(note.id), "kvgate_credit_note_number": note.number},
                },
                options={"idempotency_key": idempotency_key("credit-note", note.id)},
            )
            remote_id = remote.id
            created += 1
        async with sessions() as session:
            await insert_ignore(
                session,
                StripeCreditNote,
                {"credit_note_id": note.id, "stripe_credit_note_id": remote_id, "created_at": utcnow()},
                ["credit_note_id"],
            )
            await session.commit()
    return created


async def _items_by_line(client: stripe.StripeClient, customer_id: str) -> dict[str, str]:
    items = await _call(client.v1.invoice_items.list, params={"customer": customer_id, "limit": 100})
    found: dict[str, str] = {}
    for item in await asyncio.to_thread(lambda: list(items.auto_paging_iter())):
        line_id = (item.metadata.to_dict() if item.metadata else {}).get("kvgate_invoice_line_id")
        if line_id is not None and getattr(item, "invoice", None) is None:
            found[line_id] = item.id
    return found


async def _record_item(sessions: async_sessionmaker[AsyncSession], line_id: int, item_id: str) -> None:
    async with sessions() as session:
        await insert_ignore(
            session,
            StripeInvoiceItem,
            {"invoice_line_id": line_id, "stripe_invoice_item_id": item_id, "created_at": utcnow()},
            ["invoice_line_id"],
        )
        await session.commit()


async def _create_invoice(
    sessions: async_sessionmaker[AsyncSession],
    client: stripe.StripeClient,
    invoice: Invoice,
    customer_id: str,
    ours: set[str],
    expected_cents: int,
) -> str:
    # Pending items of this customer that are not ours would be swept into this invoice.
    strays = {k: v for k, v in (await _items_by_line(client, customer_id)).items() if k not in ours}
    if strays:
        raise StripeSyncError(
            f"customer {customer_id} has pending items of other invoice lines {sorted(strays)}; push those first"
        )
    created = await _call(
        client.v1.invoices.create,
        params={
            "customer": customer_id,
            "description": f"kvgate usage {invoice.period_start:%Y-%m} ({invoice.number})",
            "metadata": {"kvgate_invoice_id": str(invoice.id), "kvgate_invoice_number": invoice.number or ""},
            "pending_invoice_items_behavior": "include",
        },
        options={"idempotency_key": idempotency_key("invoice", invoice.id)},
    )
    async with sessions() as session:
        await session.execute(
            update(Invoice)
            .where(Invoice.id == invoice.id, Invoice.stripe_invoice_id.is_(None))
            .values(stripe_invoice_id=created.id, stripe_pushed_at=utcnow())
        )
        await session.commit()
    # The invoice's total, not a sum over `lines.data`: that is only the first page (10) of its lines.
    stripe_total = created.total
    if stripe_total != expected_cents:
        raise StripeSyncError(f"Stripe invoice {created.id} totals {stripe_total} cents, ours {expected_cents}")
    return created.id


async def _ensure_finalized(client: stripe.StripeClient, stripe_invoice_id: str, invoice_id: int) -> None:
    remote = await _call(client.v1.invoices.retrieve, stripe_invoice_id)
    if remote.status == "draft":
        await _call(
            client.v1.invoices.finalize_invoice,
            stripe_invoice_id,
            options={"idempotency_key": idempotency_key("invoice", invoice_id, "finalize")},
        )
