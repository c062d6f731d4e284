"""Tenants: create, list, suspend."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.security import new_id
from kvgate.errors import NotFoundError
from kvgate.tenancy import TENANT_ACTIVE, TENANT_SUSPENDED, Tenant


async def create_tenant(session: AsyncSession, *, name: str, scheduling_weight: int = 1) -> Tenant:
    tenant = Tenant(id=new_id("ten"), name=name, status=TENANT_ACTIVE, scheduling_weight=scheduling_weight)
    session.add(tenant)
    await session.commit()
    return tenant


async def list_tenants(session: AsyncSession) -> list[Tenant]:
    result = await session.scalars(select(Tenant).order_by(Tenant.created_at, Tenant.id))
    return list(result)


async def get_tenant(session: AsyncSession, *, tenant_id: str) -> Tenant:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFoundError(f"tenant {tenant_id!r} not found")
    return tenant


async def set_scheduling_weight(session: AsyncSession, *, tenant_id: str, weight: int) -> Tenant:
    tenant = await get_tenant(session, tenant_id=tenant_id)
    tenant.scheduling_weight = weight
    await session.commit()
    return tenant


async def set_tenant_status(session: AsyncSession, *, tenant_id: str, suspended: bool) -> Tenant:
    tenant = await get_tenant(session, tenant_id=tenant_id)
    tenant.status = TENANT_SUSPENDED if suspended else TENANT_ACTIVE
    await session.commit()
    return tenant
