"""/: the logged-in member's Overview: this month's spend against the budget, cache, savings, credit."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.deps import GatewayDep
from gateway.services.tenants import get_tenant
from kvgate.db import utcnow
from web.deps import TenantViewerDep
from web.rendering import page
from web.summaries import tenant_overview

router = APIRouter()


@router.get("/")
async def overview(request: Request, viewer: TenantViewerDep, gw: GatewayDep) -> Response:
    async with gw.sessions() as session:
        tenant = await get_tenant(session, tenant_id=viewer.tenant_id or "")
        summary = await tenant_overview(session, tenant=tenant, now=utcnow())
    return page(request, "overview.html", viewer=viewer, active="overview", summary=summary)
