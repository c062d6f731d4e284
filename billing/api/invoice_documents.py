"""Admin: an invoice or a credit note as a document, GET /admin/v1/invoices/{id}/pdf and /html,
/admin/v1/credit-notes/{id}/pdf and /html."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import HTMLResponse, Response

from billing import operations
from billing.api.deps import CreditNoteId, InvoiceId, SessionDep, SettingsDep
from billing.credit_note_documents import render_credit_note_html, render_credit_note_pdf
from billing.render import render_html, render_pdf

router = APIRouter()


@router.get("/invoices/{invoice_id}/pdf", response_class=Response)
async def get_invoice_pdf(invoice_id: InvoiceId, session: SessionDep, settings: SettingsDep) -> Response:
    document = await operations.invoice_document(
        session=session, invoice_id=invoice_id, seller=settings.seller_name, settings=settings
    )
    name = document.number or f"draft-{invoice_id}"
    headers = {"content-disposition": f'inline; filename="{name}.pdf"'}
    return Response(render_pdf(document), media_type="application/pdf", headers=headers)


@router.get("/invoices/{invoice_id}/html", response_class=HTMLResponse)
async def get_invoice_html(invoice_id: InvoiceId, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    document = await operations.invoice_document(
        session=session, invoice_id=invoice_id, seller=settings.seller_name, settings=settings
    )
    return HTMLResponse(render_html(document))


@router.get("/credit-notes/{credit_note_id}/pdf", response_class=Response)
async def get_credit_note_pdf(credit_note_id: CreditNoteId, session: SessionDep, settings: SettingsDep) -> Response:
    document = await operations.credit_note_document(
        session=session, credit_note_id=credit_note_id, seller=settings.seller_name, settings=settings
    )
    headers = {"content-disposition": f'inline; filename="{document.number}.pdf"'}
    return Response(render_credit_note_pdf(document), media_type="application/pdf", headers=headers)


@router.get("/credit-notes/{credit_note_id}/html", response_class=HTMLResponse)
async def get_credit_note_html(
    credit_note_id: CreditNoteId, session: SessionDep, settings: SettingsDep
) -> HTMLResponse:
    document = await operations.credit_note_document(
        session=session, credit_note_id=credit_note_id, seller=settings.seller_name, settings=settings
    )
    return HTMLResponse(render_credit_note_html(document))
