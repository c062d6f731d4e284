"""Admin: spend limits, under /admin/v1/tenants/{id}/budget and /admin/v1/keys/{id}/budget."""

from __future__ import annotations

from fastapi import APIRouter

from billing import operations
from billing.api.deps import SessionDep
from billing.money import parse_usd
from billing.schemas import BudgetOut, KeyBudgetIn, KeyBudgetOut, TenantBudgetIn

router = APIRouter()


@router.get("/tenants/{tenant_id}/budget", response_model=BudgetOut)
async def get_budget(tenant_id: str, session: SessionDep) -> BudgetOut:
    return BudgetOut.of(await operations.budget_status(session=session, tenant_id=tenant_id))


@router.put("/tenants/{tenant_id}/budget", response_model=BudgetOut)
async def put_budget(tenant_id: str, body: TenantBudgetIn, session: SessionDep) -> BudgetOut:
    limit = None if body.monthly_limit_usd is None else parse_usd(body.monthly_limit_usd, field="monthly_limit_usd")
    status = await operations.set_tenant_budget(
        session=session, tenant_id=tenant_id, monthly_limit_pico=limit, prepaid=body.prepaid
    )
    return BudgetOut.of(status)


@router.put("/keys/{key_id}/budget", response_model=KeyBudgetOut)
async def put_key_budget(key_id: str, body: KeyBudgetIn, session: SessionDep) -> KeyBudgetOut:
    limit = None if body.monthly_limit_usd is None else parse_usd(body.monthly_limit_usd, field="monthly_limit_usd")
    return KeyBudgetOut.of(await operations.set_key_budget(session=session, key_id=key_id, monthly_limit_pico=limit))
