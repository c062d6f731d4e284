"""/admin: the operator's page (members get 403): every tenant at a glance, and "view as tenant"."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import RedirectResponse, Response

from gateway.api.deps import GatewayDep
from gateway.services.tenants import get_tenant, list_tenants
from web.deps import VIEW_AS_COOKIE, OperatorCsrfViewerDep, OperatorViewerDep, is_secure
from web.rendering import page

router = APIRouter()


@router.get("/admin")
async def admin(request: Request, viewer: OperatorViewerDep, gw: GatewayDep) -> Response:
    async with gw.sessions() as session:
        tenants = await list_tenants(session)
    return page(request, "admin.html", viewer=viewer, active="admin", tenants=tenants)


@router.post("/admin/view-as")
async def view_as(
    request: Request, viewer: OperatorCsrfViewerDep, gw: GatewayDep, tenant_id: Annotated[str, Form(max_length=40)]
) -> Response:
    async with gw.sessions() as session:
        tenant = await get_tenant(session, tenant_id=tenant_id)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(VIEW_AS_COOKIE, tenant.id, httponly=True, samesite="lax", secure=is_secure(request), path="/")
    return response


@router.post("/admin/view-as/clear")
async def stop_viewing_as(viewer: OperatorCsrfViewerDep) -> Response:
    response = RedirectResponse("/admin", status_code=303)
    response.delete_cookie(VIEW_AS_COOKIE, path="/")
    return response
