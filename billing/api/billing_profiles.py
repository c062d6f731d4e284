"""Admin: a tenant's billing profile (buyer block and tax treatment), under /admin/v1/tenants/{id}/billing-profile."""

from __future__ import annotations

from fastapi import APIRouter

from billing import operations, profiles
from billing.api.deps import SessionDep, SettingsDep
from billing.profile_schemas import BillingProfileBody

router = APIRouter()


@router.get("/tenants/{tenant_id}/billing-profile", response_model=BillingProfileBody)
async def get_billing_profile(tenant_id: str, session: SessionDep) -> BillingProfileBody:
    return BillingProfileBody.of(await profiles.get_profile(session=session, tenant_id=tenant_id))


@router.put("/tenants/{tenant_id}/billing-profile", response_model=BillingProfileBody)
async def put_billing_profile(
    tenant_id: str, body: BillingProfileBody, session: SessionDep, settings: SettingsDep
) -> BillingProfileBody:
    """The whole profile, tax included: tax treatment is the operator's (tenants edit the rest on the dashboard)."""
    profile = await operations.set_billing_profile(
        session=session, tenant_id=tenant_id, profile=body.to_profile(), seller_country=settings.seller_address_country
    )
    return BillingProfileBody.of(profile)
