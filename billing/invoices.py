"""Invoice lifecycle: a live draft per tenant-month, finalized once (numbered, frozen) after the month.

A draft has no stored lines: it is computed from the ledger whenever it is shown,
so late records simply appear on it. Finalizing writes the lines, takes the next
number from a gapless sequence and fixes the totals, all in one transaction; from
then on triggers refuse any change to those (see migration 0002_billing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from sqlalchemy import case, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from billing.catalog import to_version
from billing.errors import BillingDomainError
from billing.invoice_lines import InvoiceComputation, InvoiceLine, UsageAggregate, compute_invoice
from billing.ledger import TOKEN_COLUMNS
from billing.models import CreditNote, Invoice, InvoiceLineRow, LedgerEntry, PriceVersionRow
from billing.numbering import next_number
from billing.periods import finalizable_at, month_bounds, month_start
from billing.profiles import BillingProfile, TaxTreatment, get_profile
from billing.render import InvoiceDocument
from billing.tax import TaxLine, tax_lines
from billing.vat_in_eur import VatInEur, vat_in_eur
from kvgate.db import insert_ignore, utcnow
from kvgate.errors import ConflictError, NotFoundError
from kvgate.tenancy import Tenant
from kvgate.usage import Category, EntryKind, TokenCounts

DRAFT = "draft"
FINALIZED = "finalized"
PAID = "paid"
PAYMENT_FAILED = "payment_failed"
VOID = "void"
STATUSES = (DRAFT, FINALIZED, PAID, PAYMENT_FAILED, VOID)


class InvoiceError(BillingDomainError):
    pass


class InvoiceNotFoundError(NotFoundError, InvoiceError):
    pass


class InvoiceStateError(ConflictError, InvoiceError):
    """The invoice is not in a state that allows this (e.g. finalizing a running month)."""


# Finalized before migration 0004 recorded the buyer's tax treatment: issued with no tax.
_UNRECORDED_TAX = TaxTreatment(treatment="exempt", note="Issued before tax treatment was recorded; no tax charged.")


@dataclass(frozen=True)
class InvoiceView:
    """An invoice with its lines: stored ones if finalized, computed ones for a draft.

    Totals: subtotal (sum of the rounded lines) + tax = total; total - credit notes = amount due.
    A draft takes the buyer's current profile; a finalized invoice the one copied when it was issued.
    """

    invoice: Invoice
    computation: InvoiceComputation
    credit_notes: tuple[CreditNote, ...]
    buyer: BillingProfile | None = None
    seller: BillingProfile | None = None
    tax_lines: tuple[TaxLine, ...] = ()

    @property
    def credited_cents(self) -> int:
        return sum(note.amount_cents for note in self.credit_notes)

    @property
    def subtotal_cents(self) -> int:
        return self.computation.total_cents

    @property
    def tax_cents(self) -> int:
        return sum(line.amount_cents for line in self.tax_lines)

    @property
    def total_cents(self) -> int:
        return self.subtotal_cents + self.tax_cents

    @property
    def amount_due_cents(self) -> int:
        return self.total_cents - self.credited_cents


async def usage_aggregates(*, session: AsyncSession, tenant_id: str, month: date) -> list[UsageAggregate]:
    """Token sums per model and price version of a tenant's entries billed in `month`."""
    net_requests = func.sum(case((LedgerEntry.kind == EntryKind.REVERSAL, -1), else_=1))
    rows = await session.execute(
        select(
            LedgerEntry.model,
            LedgerEntry.price_version_id,
            LedgerEntry.batch,
            net_requests,
            *(func.sum(c) for c in TOKEN_COLUMNS),
        )
        .where(LedgerEntry.tenant_id == tenant_id, LedgerEntry.billing_month == month)
        .group_by(LedgerEntry.model, LedgerEntry.price_version_id, LedgerEntry.batch)
    )
    return [
        UsageAggregate(
            model=model,
            price_version_id=version_id,
            requests=int(requests),
            counts=TokenCounts(*(int(v) for v in sums)),
            batch=bool(batch),
        )
        for model, version_id, batch, requests, *sums in rows.all()
    ]


async def compute_for(*, session: AsyncSession, tenant_id: str, month: date) -> InvoiceComputation:
    aggregates = await usage_aggregates(session=session, tenant_id=tenant_id, month=month)
    ids = {a.price_version_id for a in aggregates}
    rows = (await session.scalars(select(PriceVersionRow).where(PriceVersionRow.id.in_(ids)))).all() if ids else []
    return compute_invoice(aggregates=aggregates, versions={row.id: to_version(row) for row in rows})


async def ensure_drafts(*, session: AsyncSession, before: date | None = None) -> int:
    """Create the draft row for every tenant-month that has ledger entries but no invoice yet."""
    query = select(LedgerEntry.tenant_id, LedgerEntry.billing_month).distinct()
    if before is not None:
        query = query.where(LedgerEntry.billing_month < before)
    created = 0
    for tenant_id, month in (await session.execute(query)).all():
        created += await insert_ignore(
            session,
            Invoice,
            {"tenant_id": tenant_id, "period_start": month, "status": DRAFT, "currency": "usd", "created_at": utcnow()},
            ["tenant_id", "period_start"],
        )
    return created


async def get_invoice(*, session: AsyncSession, invoice_id: int, for_update: bool = False) -> Invoice:
    query = select(Invoice).where(Invoice.id == invoice_id)
    if for_update:
        query = query.with_for_update()
    invoice = await session.scalar(query.execution_options(populate_existing=True))
    if invoice is None:
        raise InvoiceNotFoundError(f"no invoice {invoice_id}")
    return invoice


async def list_invoices(
    *,
    session: AsyncSession,
    tenant_id: str | None = None,
    status: str | None = None,
    month: date | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Invoice]:
    query = select(Invoice).order_by(Invoice.period_start.desc(), Invoice.id.desc()).limit(limit).offset(offset)
    if tenant_id is not None:
        query = query.where(Invoice.tenant_id == tenant_id)
    if status is not None:
        query = query.where(Invoice.status == status)
    if month is not None:
        query = query.where(Invoice.period_start == month)
    return list((await session.scalars(query)).all())


async def view_invoice(*, session: AsyncSession, invoice_id: int) -> InvoiceView:
    invoice = await get_invoice(session=session, invoice_id=invoice_id)
    seller: BillingProfile | None = None
    if invoice.status == DRAFT:
        computation = await compute_for(session=session, tenant_id=invoice.tenant_id, month=invoice.period_start)
        buyer = await get_profile(session=session, tenant_id=invoice.tenant_id)
        taxes = tax_lines(subtotal_cents=computation.total_cents, treatment=buyer.tax)
    else:
        computation = await _stored_computation(session, invoice)
        buyer, seller, taxes = await _issued_parties(session, invoice)
    notes = (
        await session.scalars(select(CreditNote).where(CreditNote.invoice_id == invoice.id).order_by(CreditNote.id))
    ).all()
    return InvoiceView(
        invoice=invoice,
        computation=computation,
        credit_notes=tuple(notes),
        buyer=buyer,
        seller=seller,
        tax_lines=taxes,
    )


async def _issued_parties(
    session: AsyncSession, invoice: Invoice
) -> tuple[BillingProfile, BillingProfile | None, tuple[TaxLine, ...]]:
    """Buyer, seller and tax lines as fixed at finalization (the stored tax amount, not a recomputation)."""
    if invoice.parties_json is None:
        current = await get_profile(session=session, tenant_id=invoice.tenant_id)
        buyer = BillingProfile(
            legal_name=current.legal_name, email=current.email, address=current.address, tax=_UNRECORDED_TAX
        )
        return buyer, None, ()
    parties = json.loads(invoice.parties_json)
    buyer = BillingProfile.from_dict(parties["buyer"])
    seller = BillingProfile.from_dict(parties["seller"]) if parties.get("seller") else None
    taxes = tax_lines(subtotal_cents=invoice.total_cents or 0, treatment=buyer.tax)
    if taxes and taxes[0].amount_cents != (invoice.tax_cents or 0):
        line = taxes[0]
        taxes = (TaxLine(line.label, line.rate_percent, line.taxable_cents, invoice.tax_cents or 0),)
    return buyer, seller, taxes


async def _stored_computation(session: AsyncSession, invoice: Invoice) -> InvoiceComputation:
    rows = (
        await session.scalars(
            select(InvoiceLineRow).where(InvoiceLineRow.invoice_id == invoice.id).order_by(InvoiceLineRow.position)
        )
    ).all()
    lines = tuple(
        InvoiceLine(
            position=row.position,
            model=row.model,
            category=Category(row.category),
            price_version_id=row.price_version_id,
            tokens=row.tokens,
            unit_price_usd_per_mtok=row.unit_price_usd_per_mtok,
            exact_amount_pico=row.exact_amount_pico,
            amount_cents=row.amount_cents,
            batch=row.batch,
        )
        for row in rows
    )
    return InvoiceComputation(
        lines=lines,
        requests=invoice.requests or 0,
        total_cents=invoice.total_cents or 0,
        exact_total_pico=sum(line.exact_amount_pico for line in lines),
        uncached_cents=invoice.uncached_cents or 0,
        exact_uncached_pico=invoice.exact_uncached_pico,
    )


async def finalize_invoice(
    *,
    session: AsyncSession,
    invoice_id: int,
    number_prefix: str,
    now: datetime | None = None,
    seller: BillingProfile | None = None,
    payment_terms_days: int = 14,
) -> InvoiceView:
    """Freeze a draft whose month has ended: store its lines, number it, fix its tax, due date and
    parties (the buyer's profile and `seller` as they are now). Caller commits.

    The row lock excludes ledger writers deciding which month a late entry belongs
    to (they share-lock this row), so no entry can land in a month after its lines
    were taken.
    """
    now = now or utcnow()
    invoice = await get_invoice(session=session, invoice_id=invoice_id, for_update=True)
    if invoice.status != DRAFT:
        raise InvoiceStateError(f"invoice {invoice_id} is already {invoice.status} ({invoice.number})")
    period_end = month_bounds(invoice.period_start)[1]
    if now < period_end:
        raise InvoiceStateError(
            f"invoice {invoice_id} covers {invoice.period_start:%Y-%m}, which runs until {period_end.isoformat()}"
        )
    computation = await compute_for(session=session, tenant_id=invoice.tenant_id, month=invoice.period_start)
    buyer = await get_profile(session=session, tenant_id=invoice.tenant_id)
    taxes = tax_lines(subtotal_cents=computation.total_cents, treatment=buyer.tax)
    # Before anything is written: refused (409) when an EUR rate it needs is not loaded.
    eur = await vat_in_eur(session, seller=seller, currency=invoice.currency, taxes=taxes, issued=now.date())
    for line in computation.lines:
        session.add(
            InvoiceLineRow(
                invoice_id=invoice.id,
                position=line.position,
                model=line.model,
                category=line.category.value,
                price_version_id=line.price_version_id,
                tokens=line.tokens,
                unit_price_usd_per_mtok=line.unit_price_usd_per_mtok,
                exact_amount_pico=line.exact_amount_pico,
                amount_cents=line.amount_cents,
                batch=line.batch,
            )
        )
    parties = {"buyer": json.loads(buyer.to_json()), "seller": json.loads(seller.to_json()) if seller else None}
    number = await next_number(session=session, name="invoice")
    await session.execute(
        update(Invoice)
        .where(Invoice.id == invoice.id, Invoice.status == DRAFT)
        .values(
            status=FINALIZED,
            number=f"{number_prefix}-{number:06d}",
            requests=computation.requests,
            total_cents=computation.total_cents,
            uncached_cents=computation.uncached_cents,
            exact_uncached_pico=computation.exact_uncached_pico,
            tax_cents=sum(t.amount_cents for t in taxes),
            due_on=now.date() + timedelta(days=payment_terms_days),
            parties_json=json.dumps(parties, sort_keys=True),
            vat_eur_json=eur.to_json() if eur else None,
            finalized_at=now,
        )
    )
    await session.flush()
    return await view_invoice(session=session, invoice_id=invoice.id)


async def due_for_finalization(*, session: AsyncSession, now: datetime, grace: timedelta) -> list[int]:
    """Drafts whose month ended more than `grace` ago (creating drafts for any month with usage)."""
    await ensure_drafts(session=session, before=month_start(now))
    drafts = (await session.execute(select(Invoice.id, Invoice.period_start).where(Invoice.status == DRAFT))).all()
    return sorted(invoice_id for invoice_id, month in drafts if finalizable_at(month, grace) <= now)


async def set_payment_status(
    *, session: AsyncSession, invoice_id: int, paid: bool, at: datetime, voided: bool = False
) -> Invoice:
    """Record a payment outcome (from Stripe): paid, failed, or voided; a paid or void invoice stays so."""
    invoice = await get_invoice(session=session, invoice_id=invoice_id, for_update=True)
    if invoice.status == DRAFT:
        raise InvoiceStateError(f"invoice {invoice_id} is a draft; only finalized invoices are paid")
    if invoice.status in (PAID, VOID):
        return invoice
    values: dict[str, object]
    if voided:
        values = {"status": VOID}
    elif paid:
        values = {"status": PAID, "paid_at": at}
    else:
        values = {"status": PAYMENT_FAILED, "payment_failed_at": at}
    await session.execute(update(Invoice).where(Invoice.id == invoice_id).values(**values))
    return await get_invoice(session=session, invoice_id=invoice_id)


async def invoice_document(
    *,
    session: AsyncSession,
    view: InvoiceView,
    seller: str | BillingProfile,
    payment_instructions: str = "",
    payment_terms_days: int = 14,
) -> InvoiceDocument:
    """What the HTML and PDF show. `seller` is the seller's current profile (or just its name); a finalized
    invoice shows the seller it was issued by where that was recorded."""
    invoice = view.invoice
    tenant = await session.get(Tenant, invoice.tenant_id)
    start, end = month_bounds(invoice.period_start)
    current_seller = seller if isinstance(seller, BillingProfile) else BillingProfile(legal_name=seller)
    seller_profile = view.seller or current_seller
    return InvoiceDocument(
        invoice_id=invoice.id,
        number=invoice.number,
        status=invoice.status,
        tenant_id=invoice.tenant_id,
        tenant_name=tenant.name if tenant else invoice.tenant_id,
        period_start=start.date(),
        period_end=end.date(),
        issued_at=invoice.finalized_at,
        lines=view.computation.lines,
        requests=view.computation.requests,
        total_cents=view.computation.total_cents,
        uncached_cents=view.computation.uncached_cents,
        seller=seller_profile.legal_name,
        seller_profile=seller_profile,
        buyer=view.buyer,
        tax_lines=view.tax_lines,
        due_on=invoice.due_on,  # a draft has no issue date, so no due date either
        payment_terms_days=payment_terms_days,
        payment_instructions=payment_instructions,
        exact_total_pico=view.computation.exact_total_pico,
        exact_uncached_pico=view.computation.exact_uncached_pico,
        vat_eur=VatInEur.from_json(invoice.vat_eur_json) if invoice.vat_eur_json else None,
    )
