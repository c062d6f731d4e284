"""/admin: the operator's page (members get 403): every tenant at a glance, and "view as tenant"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import RedirectResponse, Response

from gateway.api.deps import GatewayDep
from gateway.state import Gateway
from kvgate.db import utcnow
from kvgate.tenancy import Tenant
from web.deps import VIEW_AS_COOKIE, OperatorCsrfViewerDep, OperatorViewerDep, PageNotFound, is_secure
from web.rendering import page
from web.summaries import tenant_rows

router = APIRouter()


@dataclass(frozen=True)
class SpoolState:
    """Billing's local spool: usage written to disk while the database was away, not yet replayed."""

    pending: int
    path: str
    database_up: bool


def spool_state(gw: Gateway) -> SpoolState | None:
    """The spool of billing's hooks in this server (None when another BillingHooks is wired in)."""
    service = getattr(gw.billing, "service", None)
    spool = getattr(service, "spool", None)
    if spool is None:
        return None
    return SpoolState(pending=spool.pending(), path=str(spool.path), database_up=service.health.available)


@router.get("/admin")
async def admin(request: Request, viewer: OperatorViewerDep, gw: GatewayDep) -> Response:
    async with gw.sessions() as session:
        rows = await tenant_rows(session, now=utcnow())
    return page(request, "admin.html", viewer=viewer, active="admin", rows=rows, spool=spool_state(gw))


@router.post("/admin/view-as")
async def view_as(
    request: Request, viewer: OperatorCsrfViewerDep, gw: GatewayDep, tenant_id: Annotated[str, Form(max_length=40)]
) -> Response:
    async with gw.sessions() as session:
        tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise PageNotFound("no such tenant")
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(VIEW_AS_COOKIE, tenant.id, httponly=True, samesite="lax", secure=is_secure(request), path="/")
    return response


@router.post("/admin/view-as/clear")
async def stop_viewing_as(viewer: OperatorCsrfViewerDep) -> Response:
    response = RedirectResponse("/admin", status_code=303)
    response.delete_cookie(VIEW_AS_COOKIE, path="/")
    return response
