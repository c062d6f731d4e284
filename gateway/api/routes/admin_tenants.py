"""Admin: tenants and their keys, under /admin/v1/tenants."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from gateway.api.deps import AdminDep, GatewayDep, SessionDep
from gateway.api.responses import json_response
from gateway.protocols.admin import (
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyOut,
    TenantCreate,
    TenantList,
    TenantOut,
    TenantUpdate,
)
from gateway.services import keys, tenants

router = APIRouter(prefix="/admin/v1/tenants", tags=["admin"], dependencies=[AdminDep])


@router.post("", status_code=201, response_model=TenantOut)
async def create_tenant(body: TenantCreate, session: SessionDep) -> Response:
    tenant = await tenants.create_tenant(session, name=body.name, scheduling_weight=body.scheduling_weight)
    return json_response(TenantOut.model_validate(tenant), status_code=201)


@router.get("", response_model=TenantList)
async def list_tenants(session: SessionDep) -> Response:
    rows = await tenants.list_tenants(session)
    return json_response(TenantList(data=[TenantOut.model_validate(t) for t in rows]))


@router.get("/{tenant_id}", response_model=TenantOut)
async def get_tenant(tenant_id: str, session: SessionDep) -> Response:
    return json_response(TenantOut.model_validate(await tenants.get_tenant(session, tenant_id=tenant_id)))


@router.patch("/{tenant_id}", response_model=TenantOut)
async def update_tenant(tenant_id: str, body: TenantUpdate, session: SessionDep, gw: GatewayDep) -> Response:
    tenant = await tenants.set_scheduling_weight(session, tenant_id=tenant_id, weight=body.scheduling_weight)
    await gw.evict_principals(tenant_id=tenant.id)  # cached principals carry the old weight
    return json_response(TenantOut.model_validate(tenant))


@router.post("/{tenant_id}/suspend", response_model=TenantOut)
async def suspend_tenant(tenant_id: str, session: SessionDep, gw: GatewayDep) -> Response:
    tenant = await tenants.set_tenant_status(session, tenant_id=tenant_id, suspended=True)
    await gw.evict_principals(tenant_id=tenant.id)
    return json_response(TenantOut.model_validate(tenant))


@router.post("/{tenant_id}/activate", response_model=TenantOut)
async def activate_tenant(tenant_id: str, session: SessionDep) -> Response:
    tenant = await tenants.set_tenant_status(session, tenant_id=tenant_id, suspended=False)
    return json_response(TenantOut.model_validate(tenant))


@router.post("/{tenant_id}/keys", status_code=201, response_model=KeyCreated)
async def create_key(tenant_id: str, body: KeyCreate, session: SessionDep) -> Response:
    key, plaintext = await keys.create_key(
        session,
        tenant_id=tenant_id,
        name=body.name,
        expires_at=body.expires_at,
        requests_per_minute=body.requests_per_minute,
        input_tokens_per_minute=body.input_tokens_per_minute,
        scopes=body.scopes,
    )
    created = KeyCreated(**KeyOut.model_validate(key).model_dump(), key=plaintext)
    return json_response(created, status_code=201)


@router.get("/{tenant_id}/keys", response_model=KeyList)
async def list_keys(tenant_id: str, session: SessionDep) -> Response:
    rows = await keys.list_keys(session, tenant_id=tenant_id)
    return json_response(KeyList(data=[KeyOut.model_validate(k) for k in rows]))
