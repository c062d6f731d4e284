"""The operator's side of budgets: setting monthly limits and granting prepaid credit.

Admission and settlement (reserve, release, add_spend) live in billing/budgets.py.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from billing.budgets import BudgetError, UnknownOwnerError
from billing.models import CreditGrant, KeyBudget, TenantBudget
from billing.money import MAX_AMOUNT_PICO, PICO_PER_CENT, format_usd
from kvgate.db import insert_ignore, utcnow
from kvgate.tenancy import ApiKey, Tenant


def _check_limit(monthly_limit_pico: int | None) -> None:
    if monthly_limit_pico is None:
        return
    if monthly_limit_pico < 0:
        raise BudgetError("monthly limit must not be negative", field="monthly_limit_usd")
    if monthly_limit_pico > MAX_AMOUNT_PICO:
        raise BudgetError(f"monthly limit must be at most {_max_usd()}", field="monthly_limit_usd")


def _max_usd() -> str:
    return format_usd(MAX_AMOUNT_PICO // PICO_PER_CENT)


async def _require_tenant(session: AsyncSession, tenant_id: str) -> None:
    if await session.get(Tenant, tenant_id) is None:
        raise UnknownOwnerError(f"no tenant {tenant_id}")


async def set_tenant_budget(
    *,
    session: AsyncSession,
    tenant_id: str,
    monthly_limit_pico: int | None,
    prepaid: bool | None = None,
) -> TenantBudget:
    _check_limit(monthly_limit_pico)
    await _require_tenant(session, tenant_id)
    await insert_ignore(
        session,
        TenantBudget,
        {"tenant_id": tenant_id, "prepaid": False, "credit_granted_pico": 0, "updated_at": utcnow()},
        ["tenant_id"],
    )
    values: dict[str, object] = {"monthly_limit_pico": monthly_limit_pico, "updated_at": utcnow()}
    if prepaid is not None:
        values["prepaid"] = prepaid
    await session.execute(update(TenantBudget).where(TenantBudget.tenant_id == tenant_id).values(**values))
    budget = await session.get(TenantBudget, tenant_id, populate_existing=True)
    assert budget is not None
    return budget


async def set_key_budget(
    *, session: AsyncSession, tenant_id: str, api_key_id: str, monthly_limit_pico: int | None
) -> KeyBudget:
    _check_limit(monthly_limit_pico)
    key = await session.get(ApiKey, api_key_id)
    if key is None or key.tenant_id != tenant_id:
        raise UnknownOwnerError(f"no API key {api_key_id} for tenant {tenant_id}")
    await insert_ignore(
        session,
        KeyBudget,
        {
            "api_key_id": api_key_id,
            "tenant_id": tenant_id,
            "monthly_limit_pico": None,
            "updated_at": utcnow(),
        },
        ["api_key_id"],
    )
    await session.execute(
        update(KeyBudget)
        .where(KeyBudget.api_key_id == api_key_id)
        .values(monthly_limit_pico=monthly_limit_pico, updated_at=utcnow())
    )
    budget = await session.get(KeyBudget, api_key_id, populate_existing=True)
    assert budget is not None
    return budget


async def grant_credit(
    *, session: AsyncSession, tenant_id: str, amount_pico: int, note: str, idempotency_key: str | None = None
) -> tuple[CreditGrant, bool]:
    """Add prepaid credit; with an idempotency key a repeated grant is returned, not added again."""
    if amount_pico <= 0:
        raise BudgetError("a credit grant must be positive", field="amount_usd")
    await _require_tenant(session, tenant_id)
    if idempotency_key is not None:
        existing = await session.scalar(select(CreditGrant).where(CreditGrant.idempotency_key == idempotency_key))
        if existing is not None:
            if existing.tenant_id != tenant_id or existing.amount_pico != amount_pico:
                raise BudgetError("idempotency key already used for a different grant")
            return existing, False
    if amount_pico > MAX_AMOUNT_PICO:
        raise BudgetError(f"a credit grant must be at most {_max_usd()}", field="amount_usd")
    await set_tenant_budget_defaults(session=session, tenant_id=tenant_id)
    granted = await session.scalar(
        select(TenantBudget.credit_granted_pico).where(TenantBudget.tenant_id == tenant_id).with_for_update()
    )
    if (granted or 0) + amount_pico > MAX_AMOUNT_PICO:
        raise BudgetError(
            f"the tenant's granted credit would exceed {_max_usd()}, the most kvgate stores", field="amount_usd"
        )
    grant = CreditGrant(tenant_id=tenant_id, amount_pico=amount_pico, note=note[:500], idempotency_key=idempotency_key)
    session.add(grant)
    await session.flush()
    await session.execute(
        update(TenantBudget)
        .where(TenantBudget.tenant_id == tenant_id)
        .values(credit_granted_pico=TenantBudget.credit_granted_pico + amount_pico, updated_at=utcnow())
    )
    return grant, True


async def set_tenant_budget_defaults(*, session: AsyncSession, tenant_id: str) -> None:
    await insert_ignore(
        session,
        TenantBudget,
        {"tenant_id": tenant_id, "prepaid": False, "credit_granted_pico": 0, "updated_at": utcnow()},
        ["tenant_id"],
    )
