"""Admin: credit notes against finalized invoices, under /admin/v1/invoices/{id}/credit-notes and /credit-notes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from billing import credit_notes, operations
from billing.api.deps import MAX_ID, IdFilter, InvoiceId, ServiceDep, SessionDep
from billing.invoice_schemas import CreditNoteIn, CreditNoteList, CreditNoteOut
from billing.money import parse_usd

router = APIRouter()


@router.post("/invoices/{invoice_id}/credit-notes", status_code=201, response_model=CreditNoteOut)
async def post_credit_note(
    invoice_id: InvoiceId, body: CreditNoteIn, session: SessionDep, service: ServiceDep
) -> CreditNoteOut:
    settings = service.settings
    note = await operations.issue_credit_note(
        session=session,
        invoice_id=invoice_id,
        amount_cents=parse_usd(body.amount_usd, field="amount_usd", cents=True),
        reason=body.reason,
        number_prefix=settings.invoice_number_prefix,
    )
    await operations.auto_push(sessions=service.sessions, settings=settings, invoice_id=invoice_id)
    return CreditNoteOut.of(note)


@router.get("/credit-notes", response_model=CreditNoteList)
async def get_credit_notes(
    session: SessionDep,
    invoice_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    tenant_id: IdFilter = None,
) -> CreditNoteList:
    notes = await credit_notes.list_credit_notes(session=session, invoice_id=invoice_id, tenant_id=tenant_id)
    return CreditNoteList(data=[CreditNoteOut.of(n) for n in notes])
