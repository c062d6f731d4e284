"""Credit notes: numbered reductions of a finalized invoice (the invoice itself never changes)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from billing.errors import BillingDomainError
from billing.invoices import DRAFT, InvoiceStateError, get_invoice
from billing.models import CreditNote, Invoice
from billing.numbering import next_number
from kvgate.errors import NotFoundError


class CreditNoteError(BillingDomainError, ValueError):
    pass


class CreditNoteNotFoundError(NotFoundError, CreditNoteError):
    pass


async def issue_credit_note(
    *, session: AsyncSession, invoice_id: int, amount_cents: int, reason: str, number_prefix: str
) -> CreditNote:
    """Credit part or all of a finalized invoice; the credits may not exceed its total (tax included, since a
    credit note is a gross amount). Caller commits."""
    if amount_cents <= 0:
        raise CreditNoteError("a credit note must be for a positive amount")
    reason = reason.strip()
    if not reason:
        raise CreditNoteError("a credit note needs a reason")
    invoice = await get_invoice(session=session, invoice_id=invoice_id, for_update=True)
    if invoice.status == DRAFT:
        raise InvoiceStateError(f"invoice {invoice_id} is a draft; credit notes apply to finalized invoices")
    credited = await session.scalar(
        select(func.coalesce(func.sum(CreditNote.amount_cents), 0)).where(CreditNote.invoice_id == invoice_id)
    )
    available = (invoice.total_cents or 0) + (invoice.tax_cents or 0) - int(credited or 0)
    if amount_cents > available:
        raise CreditNoteError(
            f"invoice {invoice.number} has {available} cents left to credit; {amount_cents} requested"
        )
    number = await next_number(session=session, name="credit_note")
    note = CreditNote(
        invoice_id=invoice_id, number=f"{number_prefix}-CN-{number:06d}", amount_cents=amount_cents, reason=reason[:500]
    )
    session.add(note)
    await session.flush()
    return note


async def list_credit_notes(
    *, session: AsyncSession, invoice_id: int | None = None, tenant_id: str | None = None
) -> list[CreditNote]:
    query = select(CreditNote).order_by(CreditNote.id)
    if invoice_id is not None:
        query = query.where(CreditNote.invoice_id == invoice_id)
    if tenant_id is not None:
        query = query.join(Invoice, Invoice.id == CreditNote.invoice_id).where(Invoice.tenant_id == tenant_id)
    return list((await session.scalars(query)).all())


async def get_credit_note(*, session: AsyncSession, credit_note_id: int) -> CreditNote:
    note = await session.get(CreditNote, credit_note_id)
    if note is None:
        raise CreditNoteNotFoundError(f"credit note {credit_note_id} not found")
    return note
