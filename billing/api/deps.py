"""Dependencies for billing's routes: the billing service, its settings, a DB session, ids, usage filters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Path, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession

from billing.errors import NotConfiguredError
from billing.hooks import GatewayBilling
from billing.service import BillingService
from billing.settings import BillingSettings
from billing.usage_queries import UsageFilter, UsageQueryError
from kvgate.errors import database_unavailable_error

# Ids are 64-bit in the database; a larger number is a 400, not a driver overflow.
MAX_ID = 2**63 - 1
InvoiceId = Annotated[int, Path(ge=1, le=MAX_ID)]
CreditNoteId = Annotated[int, Path(ge=1, le=MAX_ID)]
# Text filters: no NUL, which PostgreSQL text cannot hold (a 400, not a driver error).
NO_NUL = r"^[^\x00]*$"
IdFilter = Annotated[str | None, Query(max_length=40, pattern=NO_NUL)]
ModelFilter = Annotated[str | None, Query(max_length=200, pattern=NO_NUL)]


# Async although they do not await: FastAPI runs plain `def` dependencies in a thread pool.


async def get_billing(request: Request) -> GatewayBilling:
    billing = getattr(getattr(request.app.state, "gateway", None), "billing", None)
    if not isinstance(billing, GatewayBilling):
        raise NotConfiguredError("billing is not enabled on this server")
    return billing


BillingDep = Annotated[GatewayBilling, Depends(get_billing)]


async def get_service(billing: BillingDep) -> BillingService:
    return billing.service


ServiceDep = Annotated[BillingService, Depends(get_service)]


async def get_settings(service: ServiceDep) -> BillingSettings:
    return service.settings


SettingsDep = Annotated[BillingSettings, Depends(get_settings)]


async def get_session(request: Request, service: ServiceDep) -> AsyncIterator[AsyncSession]:
    # While the database is known to be away (and no probe is due): 503 at once, no timeout wait.
    if not service.health.should_try():
        raise database_unavailable_error(request.url.path)
    async with service.sessions() as session:
        yield session
    service.health.succeeded()


SessionDep = Annotated[AsyncSession, Depends(get_session)]


def _aware(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageQueryError(f"{name}: not an ISO 8601 timestamp: {value!r}") from exc
    if parsed.tzinfo is None:
        raise UsageQueryError(f"{name} must carry a time zone (e.g. 2026-03-01T00:00:00Z)")
    return parsed


async def usage_filters(
    tenant_id: IdFilter = None,
    api_key_id: IdFilter = None,
    model: ModelFilter = None,
    start: Annotated[str | None, Query(description="Inclusive, ISO 8601 with offset")] = None,
    end: Annotated[str | None, Query(description="Exclusive, ISO 8601 with offset")] = None,
) -> UsageFilter:
    start_at, end_at = _aware(start, "start"), _aware(end, "end")
    return UsageFilter(tenant_id=tenant_id, api_key_id=api_key_id, model=model, start=start_at, end=end_at)


UsageFilters = Annotated[UsageFilter, Depends(usage_filters)]
