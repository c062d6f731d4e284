"""Who is looking at the dashboard: the browser session behind the `kvgate_session` cookie.

A session belongs to a member of one tenant, or to the operator (member_id NULL), who picks
a tenant to view as (the `kvgate_view_as` cookie, set only through the admin page). Every page
and every dashboard route reads the tenant from the Viewer, never from the URL, so a tenant can
never reach another's data by guessing ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.api.deps import GatewayDep
from gateway.security import constant_time_equal, hash_secret
from kvgate.db import utcnow
from kvgate.tenancy import Member, Tenant
from web.models import WebSession
from web.settings import WebSettings, public_url

SESSION_COOKIE = "kvgate_session"
VIEW_AS_COOKIE = "kvgate_view_as"
OPERATOR_ROLE = "operator"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"


class LoginRequired(Exception):
    """No valid session: pages redirect to /login, dashboard data routes answer 401."""


class NotAllowed(Exception):
    """A valid session without the role (or tenant) this page needs: 403 (404 for other tenants' ids)."""


class PageNotFound(Exception):
    """No such thing in the viewer's tenant (another tenant's id is not found either): a 404 page."""


@dataclass(frozen=True)
class Viewer:
    """The logged-in person. tenant_id is None only for the operator before choosing a tenant."""

    session_hash: str
    csrf_token: str
    role: str
    """viewer, billing, admin; or OPERATOR_ROLE."""
    tenant_id: str | None
    tenant_name: str | None
    member_id: str | None = None
    email: str | None = None

    @property
    def is_operator(self) -> bool:
        return self.role == OPERATOR_ROLE

    def can(self, role: str) -> bool:
        """At least `role` (viewer < billing < admin < operator)."""
        order = ("viewer", "billing", "admin", OPERATOR_ROLE)
        return order.index(self.role) >= order.index(role)


async def load_viewer(session: AsyncSession, *, token: str, view_as: str | None) -> Viewer | None:
    """The viewer for a session cookie's token, or None if it is unknown, expired or revoked."""
    digest = hash_secret(token)
    row = await session.get(WebSession, digest)
    now = utcnow()
    if row is None or row.revoked_at is not None or row.expires_at <= now:
        return None
    if row.member_id is None:
        tenant = await session.get(Tenant, view_as) if view_as else None
        return Viewer(
            session_hash=digest,
            csrf_token=row.csrf_token,
            role=OPERATOR_ROLE,
            tenant_id=tenant.id if tenant else None,
            tenant_name=tenant.name if tenant else None,
        )
    query = select(Member, Tenant).join(Tenant, Tenant.id == Member.tenant_id).where(Member.id == row.member_id)
    found = (await session.execute(query)).first()
    if found is None or found[0].removed_at is not None:
        return None
    member, tenant = found
    return Viewer(
        session_hash=digest,
        csrf_token=row.csrf_token,
        role=member.role,
        tenant_id=tenant.id,
        tenant_name=tenant.name,
        member_id=member.id,
        email=member.email,
    )


async def current_viewer(request: Request, gw: GatewayDep) -> Viewer:
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise LoginRequired()
    async with gw.sessions() as session:
        viewer = await load_viewer(session, token=token, view_as=request.cookies.get(VIEW_AS_COOKIE))
    if viewer is None:
        raise LoginRequired()
    return viewer


ViewerDep = Annotated[Viewer, Depends(current_viewer)]


async def tenant_viewer(viewer: ViewerDep) -> Viewer:
    """A viewer with a tenant in view (the operator must have picked one on the admin page)."""
    if viewer.tenant_id is None:
        raise NotAllowed("choose a tenant to view on the admin page")
    return viewer


TenantViewerDep = Annotated[Viewer, Depends(tenant_viewer)]


def web_settings(request: Request) -> WebSettings:
    return request.app.state.web_settings


def base_url(request: Request) -> str:
    """The dashboard's public address (KVGATE_PUBLIC_URL, else where the server listens)."""
    gateway_settings = request.app.state.gateway.settings
    return public_url(web_settings(request), host=gateway_settings.host, port=gateway_settings.port)


def is_secure(request: Request) -> bool:
    """Cookies get the Secure flag when the browser reached us over HTTPS (directly, or per KVGATE_PUBLIC_URL)."""
    return request.url.scheme == "https" or base_url(request).startswith("https://")


async def presented_csrf_token(request: Request) -> str:
    """The CSRF token a state-changing request carries: the X-CSRF-Token header (htmx) or the form field."""
    header = request.headers.get(CSRF_HEADER)
    if header:
        return header
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        value = (await request.form()).get(CSRF_FIELD)  # starlette caches the parsed form for the handler
        return value if isinstance(value, str) else ""
    return ""


async def csrf_viewer(request: Request, viewer: ViewerDep) -> Viewer:
    """The viewer, for a request that changes something: it must carry the session's CSRF token."""
    presented = await presented_csrf_token(request)
    if not presented or not constant_time_equal(presented, viewer.csrf_token):
        raise NotAllowed("this form has expired or did not come from this dashboard: reload the page and try again")
    return viewer


CsrfViewerDep = Annotated[Viewer, Depends(csrf_viewer)]


async def tenant_csrf_viewer(viewer: CsrfViewerDep) -> Viewer:
    return await tenant_viewer(viewer)


TenantCsrfViewerDep = Annotated[Viewer, Depends(tenant_csrf_viewer)]


async def operator_viewer(viewer: ViewerDep) -> Viewer:
    if not viewer.is_operator:
        raise NotAllowed("only the operator can open this page")
    return viewer


OperatorViewerDep = Annotated[Viewer, Depends(operator_viewer)]


async def operator_csrf_viewer(viewer: CsrfViewerDep) -> Viewer:
    return await operator_viewer(viewer)


OperatorCsrfViewerDep = Annotated[Viewer, Depends(operator_csrf_viewer)]
