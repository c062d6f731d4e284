"""Admin: monthly invoices, under /admin/v1/invoices: list, show, finalize, push to Stripe (one, or all due)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from billing import invoices, operations
from billing.api.deps import IdFilter, InvoiceId, ServiceDep, SessionDep
from billing.invoice_schemas import FinalizeDueOut, InvoiceList, InvoiceOut, StripePushOut
from billing.periods import parse_month

router = APIRouter()


@router.get("/invoices", response_model=InvoiceList)
async def get_invoices(
    session: SessionDep,
    tenant_id: IdFilter = None,
    status: Literal["draft", "finalized", "paid", "payment_failed", "void"] | None = None,
    month: Annotated[str | None, Query(description="YYYY-MM")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> InvoiceList:
    views = await operations.list_invoices(
        session=session,
        tenant_id=tenant_id,
        status=status,
        month=None if month is None else parse_month(month),
        limit=limit,
        offset=offset,
    )
    return InvoiceList(data=[InvoiceOut.of(v, detail=False) for v in views])


@router.get("/invoices/{invoice_id}", response_model=InvoiceOut)
async def get_invoice(invoice_id: InvoiceId, session: SessionDep) -> InvoiceOut:
    return InvoiceOut.of(await invoices.view_invoice(session=session, invoice_id=invoice_id), detail=True)


@router.post("/invoices/{invoice_id}/finalize", response_model=InvoiceOut)
async def finalize(invoice_id: InvoiceId, session: SessionDep, service: ServiceDep) -> InvoiceOut:
    settings = service.settings
    prefix = settings.invoice_number_prefix
    view = await operations.finalize_invoice(
        session=session, invoice_id=invoice_id, number_prefix=prefix, settings=settings
    )
    if await operations.auto_push(sessions=service.sessions, settings=settings, invoice_id=invoice_id):
        view = await invoices.view_invoice(session=session, invoice_id=invoice_id)
    return InvoiceOut.of(view, detail=True)


@router.post("/invoices/finalize-due", response_model=FinalizeDueOut)
async def finalize_due(service: ServiceDep) -> FinalizeDueOut:
    views = await service.finalize_due_invoices()
    return FinalizeDueOut(finalized=[InvoiceOut.of(v, detail=False) for v in views])


@router.post("/invoices/stripe/push-due", response_model=list[StripePushOut])
async def push_due(service: ServiceDep) -> list[StripePushOut]:
    results = await operations.push_due(sessions=service.sessions, settings=service.settings)
    return [StripePushOut(**result.__dict__) for result in results]


@router.post("/invoices/{invoice_id}/stripe", response_model=StripePushOut)
async def push_to_stripe(invoice_id: InvoiceId, service: ServiceDep) -> StripePushOut:
    settings = service.settings
    result = await operations.push_to_stripe(sessions=service.sessions, settings=settings, invoice_id=invoice_id)
    return StripePushOut(**result.__dict__)
