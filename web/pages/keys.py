"""/keys: the tenant's API keys by name, with this month's spend and limits; admins create and revoke them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Form, Request
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.responses import RedirectResponse, Response

from billing.budget_limits import set_key_budget
from billing.money import parse_usd
from gateway.api.deps import GatewayDep
from gateway.services import keys as key_service
from kvgate.db import utcnow
from kvgate.errors import InvalidRequestError
from kvgate.tenancy import KEY_SCOPES, SCOPE_INFERENCE, SCOPE_INVOICES_READ, SCOPE_USAGE_READ, ApiKey
from web.deps import NotAllowed, PageNotFound, TenantCsrfViewerDep, TenantViewerDep, Viewer
from web.rendering import page
from web.summaries import key_limits, key_names, key_spend

router = APIRouter()
SCOPE_HELP = {
    SCOPE_INFERENCE: "call the model APIs",
    SCOPE_USAGE_READ: "read this tenant's usage and costs (the usage API)",
    SCOPE_INVOICES_READ: "read this tenant's invoices and credit notes (the invoices API)",
}
assert set(SCOPE_HELP) == set(KEY_SCOPES), "every scope is explained on the Keys page"


@dataclass(frozen=True)
class KeyRow:
    key: ApiKey
    spent_pico: int
    requests: int
    monthly_limit_pico: int | None


async def _rows(session: AsyncSession, tenant_id: str) -> list[KeyRow]:
    names = await key_names(session, tenant_id=tenant_id)
    spend = await key_spend(session, tenant_id=tenant_id, now=utcnow())
    limits = await key_limits(session, tenant_id=tenant_id)
    rows = []
    for key_id, key in names.items():
        used = spend.get(key_id)
        rows.append(KeyRow(key, used.cost_pico if used else 0, used.requests if used else 0, limits.get(key_id)))
    return rows


async def _render(
    request: Request, viewer: Viewer, gw: GatewayDep, *, status_code: int = 200, **extra: object
) -> Response:
    async with gw.sessions() as session:
        rows = await _rows(session, viewer.tenant_id or "")
    return page(
        request,
        "keys.html",
        key_scopes=KEY_SCOPES,
        scope_help=SCOPE_HELP,
        status_code=status_code,
        viewer=viewer,
        active="keys",
        rows=rows,
        can_manage=viewer.can("admin"),
        **extra,
    )


def _whole(label: str, text: str, most: int) -> int | None:
    """An optional whole number from 1 to `most`, as typed into the form."""
    text = text.strip()
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) <= most:
        raise InvalidRequestError(f"{label}, if given, is a whole number from 1 to {most:,}")
    return int(text)


def _require_admin(viewer: Viewer) -> None:
    if not viewer.can("admin"):
        raise NotAllowed("only the tenant's admins can create and revoke keys")


@router.get("/keys")
async def keys_page(request: Request, viewer: TenantViewerDep, gw: GatewayDep) -> Response:
    return await _render(request, viewer, gw)


@router.post("/keys")
async def create_key(
    request: Request,
    viewer: TenantCsrfViewerDep,
    gw: GatewayDep,
    name: Annotated[str, Form(max_length=200)] = "",
    requests_per_minute: Annotated[str, Form(max_length=12)] = "",
    input_tokens_per_minute: Annotated[str, Form(max_length=12)] = "",
    monthly_budget_usd: Annotated[str, Form(max_length=20)] = "",
    expires_in_days: Annotated[str, Form(max_length=6)] = "",
    scopes: Annotated[list[str] | None, Form()] = None,
) -> Response:
    _require_admin(viewer)
    name = name.strip()
    try:
        if not name:
            raise InvalidRequestError("A key needs a name")
        rpm = _whole("requests per minute", requests_per_minute, 10_000_000)
        tpm = _whole("input tokens per minute", input_tokens_per_minute, 10**12)
        days = _whole("expires in (days)", expires_in_days, 3650)
        budget = monthly_budget_usd.strip()
        budget_pico = parse_usd(budget, field="monthly budget (USD)") if budget else None
        granted = key_service.check_scopes(scopes or ())
    except InvalidRequestError as exc:
        return await _render(request, viewer, gw, status_code=400, error=f"{exc.message}.")
    tenant_id = viewer.tenant_id or ""
    async with gw.sessions() as session:
        key, plaintext = await key_service.create_key(
            session,
            tenant_id=tenant_id,
            name=name,
            expires_at=utcnow() + timedelta(days=days) if days else None,
            requests_per_minute=rpm,
            input_tokens_per_minute=tpm,
            scopes=granted,
        )
        if budget_pico is not None:
            await set_key_budget(
                session=session, tenant_id=tenant_id, api_key_id=key.id, monthly_limit_pico=budget_pico
            )
            await session.commit()
    # The key is in this response only (no redirect): it is never stored, and never shown again.
    return await _render(request, viewer, gw, status_code=201, created=key, plaintext=plaintext)


@router.post("/keys/{key_id}/revoke")
async def revoke_key(key_id: str, viewer: TenantCsrfViewerDep, gw: GatewayDep) -> Response:
    _require_admin(viewer)
    async with gw.sessions() as session:
        key = await session.get(ApiKey, key_id)
        # Another tenant's key is not found, exactly like a key that does not exist.
        if key is None or key.tenant_id != viewer.tenant_id:
            raise PageNotFound("no such key")
        await key_service.revoke_key(session, key_id=key.id)
    gw.auth_cache.evict(key_id=key_id)
    return RedirectResponse("/keys", status_code=303)
