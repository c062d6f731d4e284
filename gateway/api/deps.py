"""Dependencies for the routes: the gateway state, a DB session, the caller (tenant key or admin)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.generation import RequestContext
from gateway.principals import resolve_principal
from gateway.settings import GatewaySettings
from gateway.state import Gateway
from kvgate.errors import AuthenticationError, database_unavailable_error


# Dependencies are async even when they do not await: FastAPI runs plain `def`
# dependencies in a thread pool, a thread hand-off per request for nothing.
async def get_gateway(request: Request) -> Gateway:
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def get_settings(gw: GatewayDep) -> GatewaySettings:
    return gw.settings


SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]


async def get_session(request: Request, gw: GatewayDep) -> AsyncIterator[AsyncSession]:
    """A session for an admin route. While the database is known to be down (and no probe is
    due) the route is not run: 503 at once instead of a wait for the timeout."""
    if not gw.db_health.should_try():
        raise database_unavailable_error(request.url.path)
    async with gw.sessions() as session:
        yield session
    gw.db_health.succeeded()


SessionDep = Annotated[AsyncSession, Depends(get_session)]


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def get_request_context(request: Request, gw: GatewayDep) -> RequestContext:
    """Authenticate the tenant's key (x-api-key or Authorization: Bearer)."""
    presented = request.headers.get("x-api-key") or _bearer(request)
    if not presented:
        raise AuthenticationError("x-api-key header is required")
    principal = await resolve_principal(gw, presented=presented, path=request.url.path)
    state = request.scope["state"]
    ctx = RequestContext(
        request_id=state["request_id"],
        principal=principal,
        started_at=state["started_at"],
        t0=state["t0"],
        log=state["log"],
    )
    ctx.log.update(tenant_id=principal.tenant_id, api_key_id=principal.api_key_id)
    return ctx


ContextDep = Annotated[RequestContext, Depends(get_request_context)]


async def require_admin(request: Request, gw: GatewayDep) -> None:
    token = _bearer(request)
    if token is None or not gw.admin.verify(token):
        raise AuthenticationError("a valid admin token is required (Authorization: Bearer <token>)")


AdminDep = Depends(require_admin)
