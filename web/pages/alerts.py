"""/alerts: which alerts the tenant gets, who is mailed, its webhook endpoints (a new one's signing secret is
shown once), and the latest deliveries with every attempt. Everyone reads it; admins change it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import RedirectResponse, Response

from alerts import store
from alerts.delivery import MAX_ATTEMPTS
from alerts.kinds import KIND_HELP, KINDS
from alerts.settings import AlertSettings
from alerts.signing import EVENT_ID_HEADER, SIGNATURE_HEADER
from gateway.api.deps import GatewayDep
from kvgate.errors import InvalidRequestError
from web.deps import NotAllowed, PageNotFound, TenantCsrfViewerDep, TenantViewerDep, Viewer
from web.rendering import page

router = APIRouter()


async def _render(
    request: Request, viewer: Viewer, gw: GatewayDep, *, status_code: int = 200, **extra: object
) -> Response:
    tenant_id = viewer.tenant_id or ""
    async with gw.sessions() as session:
        current = await store.tenant_alerts(session, tenant_id)
        deliveries = await store.recent_deliveries(session, tenant_id=tenant_id)
    return page(
        request,
        "alerts.html",
        status_code=status_code,
        viewer=viewer,
        active="alerts",
        kinds=KINDS,
        kind_help=KIND_HELP,
        current=current,
        deliveries=deliveries,
        max_attempts=MAX_ATTEMPTS,
        signature_header=SIGNATURE_HEADER,
        event_id_header=EVENT_ID_HEADER,
        can_manage=viewer.can("admin"),
        **extra,
    )


def _require_admin(viewer: Viewer) -> None:
    if not viewer.can("admin"):
        raise NotAllowed("only the tenant's admins can change its alerts")


@router.get("/alerts")
async def alerts_page(request: Request, viewer: TenantViewerDep, gw: GatewayDep) -> Response:
    return await _render(request, viewer, gw)


@router.post("/alerts")
async def save_alerts(
    request: Request,
    viewer: TenantCsrfViewerDep,
    gw: GatewayDep,
    kinds: Annotated[list[str] | None, Form()] = None,
    recipients: Annotated[str, Form(max_length=8000)] = "",
) -> Response:
    _require_admin(viewer)
    unknown = set(kinds or ()) - set(KINDS)
    try:
        if unknown:
            raise InvalidRequestError(f"unknown alert kind: {sorted(unknown)[0][:40]}")
        addresses = store.parse_recipients(recipients)
    except InvalidRequestError as exc:
        return await _render(request, viewer, gw, status_code=400, error=f"{exc.message}.")
    async with gw.sessions() as session:
        tenant_id = viewer.tenant_id or ""
        await store.save_settings(session, tenant_id=tenant_id, kinds=tuple(kinds or ()), recipients=addresses)
        await session.commit()
    return RedirectResponse("/alerts", status_code=303)


@router.post("/alerts/endpoints")
async def add_endpoint(
    request: Request, viewer: TenantCsrfViewerDep, gw: GatewayDep, url: Annotated[str, Form(max_length=4000)] = ""
) -> Response:
    _require_admin(viewer)
    try:
        async with gw.sessions() as session:
            allow_private = getattr(request.app.state, "alert_settings", AlertSettings()).alerts_allow_private_webhooks
            endpoint = await store.add_endpoint(
                session, tenant_id=viewer.tenant_id or "", url=url, allow_private=allow_private
            )
            await session.commit()
    except InvalidRequestError as exc:
        return await _render(request, viewer, gw, status_code=400, error=f"{exc.message}.")
    # The secret is in this response only (no redirect), like a new API key.
    return await _render(request, viewer, gw, status_code=201, created=endpoint)


@router.post("/alerts/endpoints/{endpoint_id}/remove")
async def remove_endpoint(endpoint_id: str, viewer: TenantCsrfViewerDep, gw: GatewayDep) -> Response:
    _require_admin(viewer)
    async with gw.sessions() as session:
        # Another tenant's endpoint is not found, exactly like one that does not exist.
        if not await store.remove_endpoint(session, tenant_id=viewer.tenant_id or "", endpoint_id=endpoint_id):
            raise PageNotFound("no such webhook endpoint")
        await session.commit()
    return RedirectResponse("/alerts", status_code=303)
