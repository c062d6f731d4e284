"""/invoices: the tenant's invoices, each as a page, a PDF and a CSV of the ledger entries it bills.

An invoice of another tenant is answered exactly like one that does not exist (404), so ids
cannot be probed. The documents come from billing's own renderers, the same as the admin API's.
"""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import AsyncIterator
from datetime import date

from fastapi import APIRouter, Request
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from billing import invoices
from billing.api.deps import MAX_ID, ServiceDep, SessionDep, SettingsDep
from billing.csv_export import CSV_COLUMNS, UsageRow
from billing.models import LedgerEntry
from billing.render import InvoiceDocument, render_html, render_pdf
from billing.service import BillingService
from billing.settings import BillingSettings
from billing.stripe_sync import client_from_settings
from billing.usage_queries import to_row
from web.deps import PageNotFound, TenantViewerDep, Viewer
from web.rendering import DOCUMENT_HEADERS, SECURITY_HEADERS, page

router = APIRouter()
CSV_PAGE = 1000
NO_SUCH_INVOICE = "No such invoice."


async def own_invoice(session: AsyncSession, viewer: Viewer, invoice_id: int) -> invoices.InvoiceView:
    """The viewer's tenant's invoice; any other id (another tenant's too) is a 404 page."""
    if not 1 <= invoice_id <= MAX_ID:
        raise PageNotFound(NO_SUCH_INVOICE)
    try:
        view = await invoices.view_invoice(session=session, invoice_id=invoice_id)
    except invoices.InvoiceNotFoundError:
        raise PageNotFound(NO_SUCH_INVOICE) from None
    if view.invoice.tenant_id != viewer.tenant_id:
        raise PageNotFound(NO_SUCH_INVOICE)
    return view


async def _document(session: AsyncSession, view: invoices.InvoiceView, settings: BillingSettings) -> InvoiceDocument:
    """The invoice as billing renders it: the seller's full profile and payment instructions included."""
    return await invoices.invoice_document(
        session=session,
        view=view,
        seller=settings.seller_profile(),
        payment_instructions=settings.payment_instructions,
        payment_terms_days=settings.payment_terms_days,
    )


@router.get("/invoices")
async def invoice_list(request: Request, viewer: TenantViewerDep, session: SessionDep) -> Response:
    # The ledger writer creates a month's draft with its first entry, so the rows are all there;
    # billing's operations.list_invoices would first scan the whole ledger for missing drafts.
    rows = await invoices.list_invoices(session=session, tenant_id=viewer.tenant_id, limit=120)
    views = [await invoices.view_invoice(session=session, invoice_id=row.id) for row in rows]
    return page(request, "invoices.html", viewer=viewer, active="invoices", views=views)


@router.get("/invoices/{invoice_id:int}")
async def invoice_page(
    request: Request, invoice_id: int, viewer: TenantViewerDep, session: SessionDep, settings: SettingsDep
) -> Response:
    view = await own_invoice(session, viewer, invoice_id)
    document = await _document(session, view, settings)
    stripe = view.invoice.stripe_invoice_id is not None and client_from_settings(settings) is not None
    return page(
        request,
        "invoice.html",
        viewer=viewer,
        active="invoices",
        doc=document,
        view=view,
        invoice=view.invoice,
        stripe=stripe,
    )


@router.get("/invoices/{invoice_id:int}/document")
async def invoice_document_page(
    request: Request, invoice_id: int, viewer: TenantViewerDep, session: SessionDep, settings: SettingsDep
) -> Response:
    """The invoice exactly as its PDF prints it; the invoice page frames it (one layout)."""
    view = await own_invoice(session, viewer, invoice_id)
    document = await _document(session, view, settings)
    return HTMLResponse(render_html(document), headers=DOCUMENT_HEADERS)


@router.get("/invoices/{invoice_id:int}.pdf")
async def invoice_pdf(
    request: Request, invoice_id: int, viewer: TenantViewerDep, session: SessionDep, settings: SettingsDep
) -> Response:
    view = await own_invoice(session, viewer, invoice_id)
    document = await _document(session, view, settings)
    pdf = await asyncio.to_thread(render_pdf, document)
    name = document.number or f"draft-{invoice_id}"
    headers = {**SECURITY_HEADERS, "content-disposition": f'inline; filename="{name}.pdf"'}
    return Response(pdf, media_type="application/pdf", headers=headers)


@router.get("/invoices/{invoice_id:int}.csv")
async def invoice_csv(
    request: Request, invoice_id: int, viewer: TenantViewerDep, session: SessionDep, service: ServiceDep
) -> Response:
    """Every ledger entry billed on the invoice, with exact amounts (they add up to its exact total)."""
    view = await own_invoice(session, viewer, invoice_id)
    invoice = view.invoice
    name = invoice.number or f"draft-{invoice_id}"
    headers = {**SECURITY_HEADERS, "content-disposition": f'attachment; filename="{name}.csv"'}
    rows = _billed_entries(service, tenant_id=invoice.tenant_id, month=invoice.period_start)
    return StreamingResponse(_csv_chunks(rows), media_type="text/csv; charset=utf-8", headers=headers)


async def _billed_entries(service: BillingService, *, tenant_id: str, month: date) -> AsyncIterator[list[UsageRow]]:
    # Its own session: the response streams after the request's dependencies have closed theirs.
    after = 0
    async with service.sessions() as session:
        while True:
            query = (
                select(LedgerEntry)
                .where(LedgerEntry.tenant_id == tenant_id, LedgerEntry.billing_month == month, LedgerEntry.id > after)
                .order_by(LedgerEntry.id)
                .limit(CSV_PAGE)
            )
            entries = (await session.scalars(query)).all()
            if entries:
                yield [to_row(entry) for entry in entries]
                after = entries[-1].id
            if len(entries) < CSV_PAGE:
                return


async def _csv_chunks(pages: AsyncIterator[list[UsageRow]]) -> AsyncIterator[str]:
    """billing's usage CSV (same columns and values as its export), a page of entries per chunk."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    async for rows in pages:
        writer.writerows(row.csv_values() for row in rows)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()


@router.get("/invoices/{invoice_id:int}/pay")
async def invoice_stripe(
    request: Request, invoice_id: int, viewer: TenantViewerDep, session: SessionDep, settings: SettingsDep
) -> Response:
    """Stripe's hosted page for the invoice (asked of Stripe each time: the link is Stripe's to change)."""
    view = await own_invoice(session, viewer, invoice_id)
    client = client_from_settings(settings)
    stripe_id = view.invoice.stripe_invoice_id
    if client is None or stripe_id is None:
        raise PageNotFound(NO_SUCH_INVOICE)
    remote = await asyncio.to_thread(client.v1.invoices.retrieve, stripe_id)
    url = getattr(remote, "hosted_invoice_url", None)
    if not url:
        raise PageNotFound("Stripe has no page for it yet.")
    return RedirectResponse(url, status_code=303)
