"""A tenant's own invoices, for its API keys with the "invoices:read" scope: GET /v1/organization/invoices,
/v1/organization/invoices/{id} (with lines and credit notes), /v1/organization/invoices/{id}/pdf and
/v1/organization/credit-notes/{id}/pdf.

Every query is scoped to the calling key's tenant: another tenant's invoice id is a 404, as an unknown one is.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import Response

from billing import credit_notes, invoices, operations
from billing.api.deps import CreditNoteId, InvoiceId, SessionDep, SettingsDep
from billing.api.tenant.deps import CallerDep
from billing.credit_note_documents import render_credit_note_pdf
from billing.invoice_schemas import InvoiceOut
from billing.render import render_pdf

router = APIRouter(prefix="/v1/organization", tags=["invoices"])


class TenantInvoiceList(BaseModel):
    object: str = "list"
    data: list[InvoiceOut]


async def _own(session: AsyncSession, tenant_id: str, invoice_id: int) -> invoices.InvoiceView:
    view = await invoices.view_invoice(session=session, invoice_id=invoice_id)
    if view.invoice.tenant_id != tenant_id:
        raise invoices.InvoiceNotFoundError(f"no invoice {invoice_id}")
    return view


@router.get("/invoices", response_model=TenantInvoiceList)
async def list_invoices(
    caller: CallerDep, session: SessionDep, limit: Annotated[int, Query(ge=1, le=100)] = 24
) -> TenantInvoiceList:
    """The tenant's invoices, newest month first (the running month's draft included)."""
    views = await operations.list_invoices(
        session=session, tenant_id=caller.tenant_id, status=None, month=None, limit=limit
    )
    return TenantInvoiceList(data=[InvoiceOut.of(v, detail=False) for v in views])


@router.get("/invoices/{invoice_id}", response_model=InvoiceOut)
async def get_invoice(invoice_id: InvoiceId, caller: CallerDep, session: SessionDep) -> InvoiceOut:
    return InvoiceOut.of(await _own(session, caller.tenant_id, invoice_id), detail=True)


@router.get("/invoices/{invoice_id}/pdf", response_class=Response)
async def get_invoice_pdf(
    invoice_id: InvoiceId, caller: CallerDep, session: SessionDep, settings: SettingsDep
) -> Response:
    view = await _own(session, caller.tenant_id, invoice_id)
    document = await invoices.invoice_document(
        session=session,
        view=view,
        seller=settings.seller_profile(),
        payment_instructions=settings.payment_instructions,
        payment_terms_days=settings.payment_terms_days,
    )
    name = document.number or f"draft-{invoice_id}"
    headers = {"content-disposition": f'inline; filename="{name}.pdf"'}
    return Response(render_pdf(document), media_type="application/pdf", headers=headers)


@router.get("/credit-notes/{credit_note_id}/pdf", response_class=Response)
async def get_credit_note_pdf(
    credit_note_id: CreditNoteId, caller: CallerDep, session: SessionDep, settings: SettingsDep
) -> Response:
    note = await credit_notes.get_credit_note(session=session, credit_note_id=credit_note_id)
    invoice = await invoices.get_invoice(session=session, invoice_id=note.invoice_id)
    if invoice.tenant_id != caller.tenant_id:  # another tenant's note is a 404 worded as an unknown one
        raise credit_notes.CreditNoteNotFoundError(f"credit note {credit_note_id} not found")
    document = await operations.credit_note_document(
        session=session, credit_note_id=credit_note_id, seller=settings.seller_name, settings=settings
    )
    headers = {"content-disposition": f'inline; filename="{document.number}.pdf"'}
    return Response(render_credit_note_pdf(document), media_type="application/pdf", headers=headers)
