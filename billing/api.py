"""Billing's HTTP API: admin routes (mounted under /admin/v1 behind the admin token) and the Stripe webhook.

Bad input is a 400 (invalid_request_error), an unknown id a 404, a state conflict
(finalizing a running month, crediting a draft) a 409: never a 500.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import date, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import HTMLResponse, Response, StreamingResponse

from billing import budgets, catalog, credit_notes, invoices, stripe_sync, webhooks
from billing.csv_export import UsageRow, iter_csv
from billing.hooks import GatewayBilling
from billing.invoice_lines import InvoiceComputation
from billing.ledger import LedgerError
from billing.money import MoneyError, format_usd_exact, usd_to_cents, usd_to_pico
from billing.periods import parse_month
from billing.prices import PriceError, PriceSpec, PriceVersion
from billing.render import render_html, render_pdf
from billing.service import BillingService, is_database_unavailable
from billing.settlement import reverse_charge
from billing.usage_queries import UsageFilter, UsageQueryError, iter_usage, list_usage, summarize
from kvgate.errors import ConflictError, InvalidRequestError, NotFoundError, UnavailableError
from kvgate.tenancy import ApiKey, Tenant

admin_router = APIRouter(tags=["billing"])
# Ids are 64-bit in the database; a larger number is a 400, not a driver overflow.
MAX_ID = 2**63 - 1
InvoiceId = Annotated[int, Path(ge=1, le=MAX_ID)]
public_router = APIRouter(tags=["billing"])


# -- dependencies --------------------------------------------------------------------------


def get_billing(request: Request) -> GatewayBilling:
    billing = getattr(getattr(request.app.state, "gateway", None), "billing", None)
    if not isinstance(billing, GatewayBilling):
        raise UnavailableError("billing is not enabled on this server")
    return billing


BillingDep = Annotated[GatewayBilling, Depends(get_billing)]


def get_service(billing: BillingDep) -> BillingService:
    return billing.service


ServiceDep = Annotated[BillingService, Depends(get_service)]


async def get_session(service: ServiceDep) -> AsyncIterator[AsyncSession]:
    async with service.sessions() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


# -- bodies ---------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


UsdAmount = Annotated[str, Field(pattern=r"^-?\d{1,12}(\.\d{1,12})?$", description="USD as a decimal string")]


def _usd(value: str | int | Decimal, *, cents: bool = False) -> int:
    try:
        return usd_to_cents(str(value)) if cents else usd_to_pico(str(value))
    except MoneyError as exc:
        raise InvalidRequestError(str(exc)) from exc


def _money(pico: int | None) -> str | None:
    return None if pico is None else format_usd_exact(pico)


def _cents(cents: int | None) -> str | None:
    return None if cents is None else str(Decimal(cents).scaleb(-2))


class UsageOut(BaseModel):
    id: int
    request_id: str
    kind: str
    tenant_id: str
    api_key_id: str | None
    model: str
    endpoint: str
    status: str
    started_at: datetime
    billing_month: str
    price_version_id: int
    input_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    cache_write_24h_tokens: int
    cache_read_tokens: int
    output_tokens: int
    cost_usd: str
    uncached_cost_usd: str
    ttft_ms: int | None
    latency_ms: int | None

    @classmethod
    def of(cls, row: UsageRow) -> UsageOut:
        values = row.shown()
        return cls(**{k: values[k] for k in cls.model_fields})


class UsageList(BaseModel):
    data: list[UsageOut]
    next_after_id: int | None


class SummaryOut(BaseModel):
    key: str | None
    requests: int
    input_tokens: int
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    cache_write_24h_tokens: int
    cache_read_tokens: int
    output_tokens: int
    cost_usd: str
    uncached_cost_usd: str


class SummaryList(BaseModel):
    group_by: str
    data: list[SummaryOut]


class PriceIn(_Strict):
    model: str = Field(min_length=1, max_length=200)
    effective_from: AwareDatetime
    input_usd_per_mtok: Decimal
    output_usd_per_mtok: Decimal
    cache_write_5m_multiplier: Decimal = Decimal("1.25")
    cache_write_1h_multiplier: Decimal = Decimal("2.0")
    cache_read_multiplier: Decimal = Decimal("0.1")
    cache_write_24h_multiplier: Decimal | None = None

    @field_validator("*", mode="before")
    @classmethod
    def _no_floats(cls, value: Any) -> Any:
        # JSON numbers arrive as floats; go through their text so 0.1 stays 0.1.
        return str(value) if isinstance(value, float) else value


class PriceOut(BaseModel):
    id: int
    model: str
    effective_from: datetime
    input_usd_per_mtok: str
    output_usd_per_mtok: str
    cache_write_5m_multiplier: str
    cache_write_1h_multiplier: str
    cache_read_multiplier: str
    cache_write_24h_multiplier: str | None
    ttl_classes: list[str]

    @classmethod
    def of(cls, v: PriceVersion) -> PriceOut:
        return cls(
            id=v.id,
            model=v.model,
            effective_from=v.effective_from,
            input_usd_per_mtok=str(v.input_usd_per_mtok),
            output_usd_per_mtok=str(v.output_usd_per_mtok),
            cache_write_5m_multiplier=str(v.cache_write_5m_multiplier),
            cache_write_1h_multiplier=str(v.cache_write_1h_multiplier),
            cache_read_multiplier=str(v.cache_read_multiplier),
            cache_write_24h_multiplier=None
            if v.cache_write_24h_multiplier is None
            else str(v.cache_write_24h_multiplier),
            ttl_classes=list(v.ttl_classes),
        )


class PriceList(BaseModel):
    data: list[PriceOut]


class TenantBudgetIn(_Strict):
    monthly_limit_usd: UsdAmount | None = None
    prepaid: bool | None = None


class KeyBudgetIn(_Strict):
    monthly_limit_usd: UsdAmount | None = None


class CounterOut(BaseModel):
    period: str
    limit_usd: str | None
    spent_usd: str
    reserved_usd: str
    remaining_usd: str | None


class BudgetOut(BaseModel):
    tenant_id: str
    monthly_limit_usd: str | None
    prepaid: bool
    credit_granted_usd: str
    month: CounterOut
    credit: CounterOut


class KeyBudgetOut(BaseModel):
    api_key_id: str
    tenant_id: str
    monthly_limit_usd: str | None


class CreditIn(_Strict):
    amount_usd: UsdAmount
    note: str = Field("", max_length=500)
    idempotency_key: str | None = Field(None, min_length=1, max_length=200)


class CreditOut(BaseModel):
    id: int
    tenant_id: str
    amount_usd: str
    note: str
    created_at: datetime
    created: bool


class LineOut(BaseModel):
    position: int
    model: str
    category: str
    tokens: int
    unit_price_usd_per_mtok: str
    amount_usd: str
    exact_amount_usd: str
    price_version_id: int


class CreditNoteOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    invoice_id: int
    number: str
    amount_usd: str
    reason: str
    created_at: datetime


class InvoiceOut(BaseModel):
    id: int
    tenant_id: str
    month: str
    status: str
    number: str | None
    currency: str
    requests: int
    total_usd: str
    uncached_usd: str
    savings_usd: str
    savings_percent: str
    credited_usd: str
    amount_due_usd: str
    created_at: datetime
    finalized_at: datetime | None
    paid_at: datetime | None
    stripe_invoice_id: str | None
    lines: list[LineOut] | None = None
    credit_notes: list[CreditNoteOut] | None = None


class InvoiceList(BaseModel):
    data: list[InvoiceOut]


class CreditNoteIn(_Strict):
    amount_usd: UsdAmount
    reason: str = Field(min_length=1, max_length=500)


class CreditNoteList(BaseModel):
    data: list[CreditNoteOut]


class ReverseIn(_Strict):
    reason: str = Field(min_length=1, max_length=500)


class ReverseOut(BaseModel):
    request_id: str
    created: bool
    entry_id: int
    cost_usd: str
    billing_month: str


class FinalizeDueOut(BaseModel):
    finalized: list[InvoiceOut]


class SpoolOut(BaseModel):
    pending: int
    replayed: int | None = None
    applied: int | None = None
    corrupt: int | None = None


class WebhookOut(BaseModel):
    received: bool
    outcome: str


class StripePushOut(BaseModel):
    invoice_id: int
    stripe_customer_id: str
    stripe_invoice_id: str
    items_created: int
    items_existing: int


# -- helpers --------------------------------------------------------------------------------


def credit_note_out(note: Any) -> CreditNoteOut:
    return CreditNoteOut(
        id=note.id,
        invoice_id=note.invoice_id,
        number=note.number,
        amount_usd=_cents(note.amount_cents) or "0",
        reason=note.reason,
        created_at=note.created_at,
    )


def invoice_out(view: invoices.InvoiceView, *, detail: bool) -> InvoiceOut:
    inv = view.invoice
    comp: InvoiceComputation = view.computation
    return InvoiceOut(
        id=inv.id,
        tenant_id=inv.tenant_id,
        month=inv.period_start.strftime("%Y-%m"),
        status=inv.status,
        number=inv.number,
        currency=inv.currency,
        requests=comp.requests,
        total_usd=_cents(comp.total_cents) or "0",
        uncached_usd=_cents(comp.uncached_cents) or "0",
        savings_usd=_cents(comp.savings_cents) or "0",
        savings_percent=str(comp.savings_percent),
        credited_usd=_cents(view.credited_cents) or "0",
        amount_due_usd=_cents(comp.total_cents - view.credited_cents) or "0",
        created_at=inv.created_at,
        finalized_at=inv.finalized_at,
        paid_at=inv.paid_at,
        stripe_invoice_id=inv.stripe_invoice_id,
        lines=[
            LineOut(
                position=line.position,
                model=line.model,
                category=line.category.value,
                tokens=line.tokens,
                unit_price_usd_per_mtok=str(line.unit_price_usd_per_mtok),
                amount_usd=_cents(line.amount_cents) or "0",
                exact_amount_usd=format_usd_exact(line.exact_amount_pico),
                price_version_id=line.price_version_id,
            )
            for line in comp.lines
        ]
        if detail
        else None,
        credit_notes=[credit_note_out(n) for n in view.credit_notes] if detail else None,
    )


def _filter(
    tenant_id: str | None, api_key_id: str | None, model: str | None, start: datetime | None, end: datetime | None
) -> UsageFilter:
    try:
        return UsageFilter(tenant_id=tenant_id, api_key_id=api_key_id, model=model, start=start, end=end)
    except UsageQueryError as exc:
        raise InvalidRequestError(str(exc)) from exc


async def _require_tenant(session: AsyncSession, tenant_id: str) -> Tenant:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFoundError(f"no tenant {tenant_id}")
    return tenant


async def _view(session: AsyncSession, invoice_id: int) -> invoices.InvoiceView:
    try:
        return await invoices.view_invoice(session=session, invoice_id=invoice_id)
    except invoices.InvoiceNotFoundError as exc:
        raise NotFoundError(str(exc)) from exc


def _month(text: str | None) -> date | None:
    if text is None:
        return None
    try:
        return parse_month(text)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc


def _aware(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidRequestError(f"{name}: not an ISO 8601 timestamp: {value!r}") from exc
    if parsed.tzinfo is None:
        raise InvalidRequestError(f"{name} must carry a time zone (e.g. 2026-03-01T00:00:00Z)")
    return parsed


def usage_filters(
    tenant_id: Annotated[str | None, Query(max_length=40)] = None,
    api_key_id: Annotated[str | None, Query(max_length=40)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    start: Annotated[str | None, Query(description="Inclusive, ISO 8601 with offset")] = None,
    end: Annotated[str | None, Query(description="Exclusive, ISO 8601 with offset")] = None,
) -> UsageFilter:
    return _filter(tenant_id, api_key_id, model, _aware(start, "start"), _aware(end, "end"))


UsageFilters = Annotated[UsageFilter, Depends(usage_filters)]


# -- usage ----------------------------------------------------------------------------------


@admin_router.get("/usage", response_model=UsageList)
async def get_usage(
    session: SessionDep,
    where: UsageFilters,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after_id: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
) -> UsageList:
    rows = await list_usage(session=session, where=where, limit=limit, after_id=after_id)
    return UsageList(data=[UsageOut.of(r) for r in rows], next_after_id=rows[-1].id if len(rows) == limit else None)


@admin_router.get("/usage/export.csv", response_class=StreamingResponse)
async def export_usage(service: ServiceDep, where: UsageFilters) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async with service.sessions() as session:
            rows = [row async for row in iter_usage(session=session, where=where)]
        for chunk in iter_csv(rows):
            yield chunk

    return StreamingResponse(
        body(), media_type="text/csv", headers={"content-disposition": 'attachment; filename="usage.csv"'}
    )


@admin_router.get("/usage/summary", response_model=SummaryList)
async def usage_summary(
    session: SessionDep, where: UsageFilters, group_by: Literal["day", "model", "key"] = "day"
) -> SummaryList:
    rows = await summarize(session=session, where=where, group_by=group_by)
    return SummaryList(
        group_by=group_by,
        data=[
            SummaryOut(
                key=r.key,
                requests=r.requests,
                **r.counts.as_columns(),
                cost_usd=format_usd_exact(r.cost_pico),
                uncached_cost_usd=format_usd_exact(r.uncached_cost_pico),
            )
            for r in rows
        ],
    )


@admin_router.post("/usage/{request_id}/reverse", response_model=ReverseOut)
async def reverse_usage(request_id: str, body: ReverseIn, session: SessionDep) -> ReverseOut:
    try:
        settlement = await reverse_charge(session=session, request_id=request_id, reason=body.reason)
    except LedgerError as exc:
        raise NotFoundError(str(exc)) from exc
    await session.commit()
    return ReverseOut(
        request_id=request_id,
        created=settlement.inserted,
        entry_id=settlement.entry_id,
        cost_usd=format_usd_exact(settlement.cost_pico),
        billing_month=settlement.billing_month.strftime("%Y-%m"),
    )


# -- prices ---------------------------------------------------------------------------------


@admin_router.get("/prices", response_model=PriceList)
async def get_prices(session: SessionDep, model: Annotated[str | None, Query(max_length=200)] = None) -> PriceList:
    return PriceList(data=[PriceOut.of(v) for v in await catalog.list_versions(session=session, model=model)])


@admin_router.post("/prices", status_code=201, response_model=PriceOut)
async def add_price(body: PriceIn, session: SessionDep, service: ServiceDep) -> PriceOut:
    try:
        spec = PriceSpec(**body.model_dump())
        version = await catalog.add_version(session=session, spec=spec, source="admin api")
    except catalog.PriceConflictError as exc:
        raise ConflictError(str(exc)) from exc
    except PriceError as exc:
        raise InvalidRequestError(str(exc)) from exc
    await session.commit()
    await service.refresh_prices()
    return PriceOut.of(version)


# -- budgets and credit -----------------------------------------------------------------------


def _counter(state: budgets.CounterState) -> CounterOut:
    return CounterOut(
        period=state.period,
        limit_usd=_money(state.limit_pico),
        spent_usd=format_usd_exact(state.spent_pico),
        reserved_usd=format_usd_exact(state.reserved_pico),
        remaining_usd=_money(state.remaining_pico),
    )


async def budget_out(session: AsyncSession, tenant_id: str) -> BudgetOut:
    status = await budgets.budget_status(session=session, tenant_id=tenant_id)
    return BudgetOut(
        tenant_id=tenant_id,
        monthly_limit_usd=_money(status.monthly_limit_pico),
        prepaid=status.prepaid,
        credit_granted_usd=format_usd_exact(status.credit_granted_pico),
        month=_counter(status.month),
        credit=_counter(status.credit),
    )


@admin_router.get("/tenants/{tenant_id}/budget", response_model=BudgetOut)
async def get_budget(tenant_id: str, session: SessionDep) -> BudgetOut:
    await _require_tenant(session, tenant_id)
    return await budget_out(session, tenant_id)


@admin_router.put("/tenants/{tenant_id}/budget", response_model=BudgetOut)
async def put_budget(tenant_id: str, body: TenantBudgetIn, session: SessionDep) -> BudgetOut:
    await _require_tenant(session, tenant_id)
    limit = None if body.monthly_limit_usd is None else _usd(body.monthly_limit_usd)
    try:
        await budgets.set_tenant_budget(
            session=session, tenant_id=tenant_id, monthly_limit_pico=limit, prepaid=body.prepaid
        )
    except budgets.BudgetError as exc:
        raise InvalidRequestError(str(exc)) from exc
    await session.commit()
    return await budget_out(session, tenant_id)


@admin_router.put("/keys/{key_id}/budget", response_model=KeyBudgetOut)
async def put_key_budget(key_id: str, body: KeyBudgetIn, session: SessionDep) -> KeyBudgetOut:
    key = await session.get(ApiKey, key_id)
    if key is None:
        raise NotFoundError(f"no API key {key_id}")
    limit = None if body.monthly_limit_usd is None else _usd(body.monthly_limit_usd)
    try:
        row = await budgets.set_key_budget(
            session=session, tenant_id=key.tenant_id, api_key_id=key_id, monthly_limit_pico=limit
        )
    except budgets.BudgetError as exc:
        raise InvalidRequestError(str(exc)) from exc
    await session.commit()
    return KeyBudgetOut(api_key_id=key_id, tenant_id=key.tenant_id, monthly_limit_usd=_money(row.monthly_limit_pico))


@admin_router.post("/tenants/{tenant_id}/credits", status_code=201, response_model=CreditOut)
async def post_credit(tenant_id: str, body: CreditIn, session: SessionDep) -> Response:
    await _require_tenant(session, tenant_id)
    try:
        grant, created = await budgets.grant_credit(
            session=session,
            tenant_id=tenant_id,
            amount_pico=_usd(body.amount_usd),
            note=body.note,
            idempotency_key=body.idempotency_key,
        )
    except budgets.BudgetError as exc:
        raise InvalidRequestError(str(exc)) from exc
    await session.commit()
    out = CreditOut(
        id=grant.id,
        tenant_id=tenant_id,
        amount_usd=format_usd_exact(grant.amount_pico),
        note=grant.note,
        created_at=grant.created_at,
        created=created,
    )
    return Response(out.model_dump_json(), status_code=201 if created else 200, media_type="application/json")


# -- invoices ---------------------------------------------------------------------------------


@admin_router.get("/invoices", response_model=InvoiceList)
async def get_invoices(
    session: SessionDep,
    tenant_id: Annotated[str | None, Query(max_length=40)] = None,
    status: Literal["draft", "finalized", "paid", "payment_failed"] | None = None,
    month: Annotated[str | None, Query(description="YYYY-MM")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10**9)] = 0,
) -> InvoiceList:
    await invoices.ensure_drafts(session=session)
    await session.commit()
    rows = await invoices.list_invoices(
        session=session, tenant_id=tenant_id, status=status, month=_month(month), limit=limit, offset=offset
    )
    return InvoiceList(data=[invoice_out(await _view(session, r.id), detail=False) for r in rows])


@admin_router.get("/invoices/{invoice_id}", response_model=InvoiceOut)
async def get_invoice(invoice_id: InvoiceId, session: SessionDep) -> InvoiceOut:
    return invoice_out(await _view(session, invoice_id), detail=True)


@admin_router.get("/invoices/{invoice_id}/pdf", response_class=Response)
async def get_invoice_pdf(invoice_id: InvoiceId, session: SessionDep, service: ServiceDep) -> Response:
    document = await invoices.invoice_document(
        session=session, view=await _view(session, invoice_id), seller=service.settings.seller_name
    )
    name = document.number or f"draft-{invoice_id}"
    return Response(
        render_pdf(document),
        media_type="application/pdf",
        headers={"content-disposition": f'inline; filename="{name}.pdf"'},
    )


@admin_router.get("/invoices/{invoice_id}/html", response_class=HTMLResponse)
async def get_invoice_html(invoice_id: InvoiceId, session: SessionDep, service: ServiceDep) -> HTMLResponse:
    document = await invoices.invoice_document(
        session=session, view=await _view(session, invoice_id), seller=service.settings.seller_name
    )
    return HTMLResponse(render_html(document))


@admin_router.post("/invoices/{invoice_id}/finalize", response_model=InvoiceOut)
async def finalize(invoice_id: InvoiceId, session: SessionDep, service: ServiceDep) -> InvoiceOut:
    try:
        view = await invoices.finalize_invoice(
            session=session, invoice_id=invoice_id, number_prefix=service.settings.invoice_number_prefix
        )
    except invoices.InvoiceNotFoundError as exc:
        raise NotFoundError(str(exc)) from exc
    except invoices.InvoiceStateError as exc:
        raise ConflictError(str(exc)) from exc
    await session.commit()
    return invoice_out(view, detail=True)


@admin_router.post("/invoices/finalize-due", response_model=FinalizeDueOut)
async def finalize_due(service: ServiceDep) -> FinalizeDueOut:
    views = await service.finalize_due_invoices()
    return FinalizeDueOut(finalized=[invoice_out(v, detail=False) for v in views])


@admin_router.post("/invoices/{invoice_id}/credit-notes", status_code=201, response_model=CreditNoteOut)
async def post_credit_note(
    invoice_id: int, body: CreditNoteIn, session: SessionDep, service: ServiceDep
) -> CreditNoteOut:
    try:
        note = await credit_notes.issue_credit_note(
            session=session,
            invoice_id=invoice_id,
            amount_cents=_usd(body.amount_usd, cents=True),
            reason=body.reason,
            number_prefix=service.settings.invoice_number_prefix,
        )
    except invoices.InvoiceNotFoundError as exc:
        raise NotFoundError(str(exc)) from exc
    except invoices.InvoiceStateError as exc:
        raise ConflictError(str(exc)) from exc
    except credit_notes.CreditNoteError as exc:
        raise InvalidRequestError(str(exc)) from exc
    await session.commit()
    return credit_note_out(note)


@admin_router.get("/credit-notes", response_model=CreditNoteList)
async def get_credit_notes(
    session: SessionDep,
    invoice_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    tenant_id: Annotated[str | None, Query(max_length=40)] = None,
) -> CreditNoteList:
    notes = await credit_notes.list_credit_notes(session=session, invoice_id=invoice_id, tenant_id=tenant_id)
    return CreditNoteList(data=[credit_note_out(n) for n in notes])


@admin_router.post("/invoices/{invoice_id}/stripe", response_model=StripePushOut)
async def push_to_stripe(invoice_id: InvoiceId, service: ServiceDep) -> StripePushOut:
    client = stripe_sync.client_from_settings(service.settings)
    if client is None:
        raise UnavailableError("Stripe is not configured: set STRIPE_API_KEY")
    try:
        result = await stripe_sync.push_invoice(
            sessions=service.sessions, client=client, invoice_id=invoice_id, currency=service.settings.stripe_currency
        )
    except invoices.InvoiceNotFoundError as exc:
        raise NotFoundError(str(exc)) from exc
    except invoices.InvoiceStateError as exc:
        raise ConflictError(str(exc)) from exc
    return StripePushOut(**result.__dict__)


# -- spool --------------------------------------------------------------------------------------


@admin_router.get("/billing/spool", response_model=SpoolOut)
async def spool_status(service: ServiceDep) -> SpoolOut:
    return SpoolOut(pending=service.spool.pending())


@admin_router.post("/billing/spool/replay", response_model=SpoolOut)
async def spool_replay(service: ServiceDep) -> SpoolOut:
    try:
        result = await service.replay_spool()
    except Exception as exc:
        if not is_database_unavailable(exc):
            raise
        raise UnavailableError(f"the database is still unavailable: {exc}") from exc
    return SpoolOut(
        pending=service.spool.pending(), replayed=result.records, applied=result.applied, corrupt=result.corrupt
    )


# -- Stripe webhook (public: authenticated by its signature) ----------------------------------


@public_router.post("/webhooks/stripe", include_in_schema=False)
async def stripe_webhook(request: Request, service: ServiceDep) -> Response:
    secret = service.settings.stripe_webhook_secret
    if secret is None:
        raise UnavailableError("Stripe webhooks are not configured: set KVGATE_STRIPE_WEBHOOK_SECRET")
    payload = await request.body()
    try:
        outcome = await webhooks.handle_stripe_webhook(
            sessions=service.sessions,
            payload=payload,
            signature=request.headers.get("stripe-signature", ""),
            secret=secret.get_secret_value(),
        )
    except webhooks.WebhookSignatureError as exc:
        raise InvalidRequestError(str(exc)) from exc
    return Response(WebhookOut(received=True, outcome=outcome).model_dump_json(), media_type="application/json")
