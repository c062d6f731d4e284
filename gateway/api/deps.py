"""Dependencies for the routes: the gateway state, a DB session, the caller (tenant key or admin)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.generation import RequestContext
from gateway.principals import resolve_principal
from gateway.services.keys import INVALID_KEY, Principal
from gateway.settings import GatewaySettings
from gateway.state import Gateway
from kvgate.errors import AuthenticationError, database_unavailable_error
from kvgate.tenancy import SCOPE_INFERENCE


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


async def _principal(request: Request, gw: Gateway) -> Principal:
    """Authenticate the tenant's key (x-api-key or Authorization: Bearer)."""
    x_api_key = request.headers.get("x-api-key")
    presented = x_api_key or _bearer(request)
    if not presented:
        raise AuthenticationError("x-api-key header is required")
    try:
        principal = await resolve_principal(gw, presented=presented, path=request.url.path)
    except AuthenticationError as error:
        if x_api_key or error.message != INVALID_KEY:
            raise
        # The key came as Authorization: Bearer (OpenAI's clients): the message names that header.
        raise AuthenticationError("invalid API key in the Authorization: Bearer header") from None
    log = request.scope["state"].get("log")
    if isinstance(log, dict):
        log.update(tenant_id=principal.tenant_id, api_key_id=principal.api_key_id)
    return principal


async def get_request_context(request: Request, gw: GatewayDep) -> RequestContext:
    """The inference routes' caller: a key with the "inference" scope (403 without it)."""
    principal = await _principal(request, gw)
    principal.require_scope(SCOPE_INFERENCE)
    state = request.scope["state"]
    return RequestContext(
        request_id=state["request_id"],
        principal=principal,
        started_at=state["started_at"],
        t0=state["t0"],
        log=state["log"],
    )


ContextDep = Annotated[RequestContext, Depends(get_request_context)]


async def require_admin(request: Request, gw: GatewayDep) -> None:
    token = _bearer(request)
    address = request.client.host if request.client else ""
    gw.admin_attempts.check(address)  # a 429 while this address is locked out: the token is not even tried
    if token is None or not gw.admin.verify(token):
        if token is not None:
            gw.admin_attempts.failed(address)
        raise AuthenticationError("a valid admin token is required (Authorization: Bearer <token>)")
    gw.admin_attempts.succeeded(address)


AdminDep = Depends(require_admin)


PRINCIPAL_STATE = "principal"
"""Where a scoped route finds its caller: request.state.principal (a Principal), set by require_scope."""


def require_scope(scope: str) -> Any:
    """A dependency for routers mounted from other packages (billing's usage API): authenticates the
    key, 403s unless it holds `scope`, and leaves the Principal in request.state.principal."""

    async def check(request: Request, gw: GatewayDep) -> None:
        principal = await _principal(request, gw)
        principal.require_scope(scope)
        setattr(request.state, PRINCIPAL_STATE, principal)

    return Depends(check)
