"""/credit-notes/{id}: a credit note of the tenant's, as HTML and PDF (documents of their own, listed beside
their invoice on /invoices). Another tenant's note is answered like one that does not exist (404)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import HTMLResponse, Response

from billing import credit_notes, invoices, operations
from billing.api.deps import MAX_ID, SessionDep, SettingsDep
from billing.credit_note_documents import CreditNoteDocument, render_credit_note_html, render_credit_note_pdf
from billing.settings import BillingSettings
from web.deps import PageNotFound, TenantViewerDep, Viewer
from web.rendering import DOCUMENT_HEADERS, SECURITY_HEADERS

router = APIRouter()
NO_SUCH_CREDIT_NOTE = "No such credit note."


async def _own_document(
    session: AsyncSession, viewer: Viewer, credit_note_id: int, settings: BillingSettings
) -> CreditNoteDocument:
    if not 1 <= credit_note_id <= MAX_ID:
        raise PageNotFound(NO_SUCH_CREDIT_NOTE)
    try:
        note = await credit_notes.get_credit_note(session=session, credit_note_id=credit_note_id)
        invoice = await invoices.get_invoice(session=session, invoice_id=note.invoice_id)
    except (credit_notes.CreditNoteNotFoundError, invoices.InvoiceNotFoundError):
        raise PageNotFound(NO_SUCH_CREDIT_NOTE) from None
    if invoice.tenant_id != viewer.tenant_id:
        raise PageNotFound(NO_SUCH_CREDIT_NOTE)
    return await operations.credit_note_document(
        session=session, credit_note_id=credit_note_id, seller=settings.seller_name, settings=settings
    )


@router.get("/credit-notes/{credit_note_id:int}")
async def credit_note_page(
    credit_note_id: int, viewer: TenantViewerDep, session: SessionDep, settings: SettingsDep
) -> Response:
    document = await _own_document(session, viewer, credit_note_id, settings)
    return HTMLResponse(render_credit_note_html(document), headers=DOCUMENT_HEADERS)


@router.get("/credit-notes/{credit_note_id:int}.pdf")
async def credit_note_pdf(
    credit_note_id: int, viewer: TenantViewerDep, session: SessionDep, settings: SettingsDep
) -> Response:
    document = await _own_document(session, viewer, credit_note_id, settings)
    pdf = await asyncio.to_thread(render_credit_note_pdf, document)
    headers = {**SECURITY_HEADERS, "content-disposition": f'inline; filename="{document.number}.pdf"'}
    return Response(pdf, media_type="application/pdf", headers=headers)
