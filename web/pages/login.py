"""/login: how to get a link, the operator's admin-token form; /login/{token}: a member's magic link; /logout."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Form, Request
from starlette.responses import RedirectResponse, Response

from gateway.api.deps import GatewayDep
from gateway.security import constant_time_equal
from kvgate.errors import RateLimitError
from web.deps import (
    CSRF_FIELD,
    SESSION_COOKIE,
    VIEW_AS_COOKIE,
    CsrfViewerDep,
    is_secure,
    web_settings,
)
from web.members import LoginLinkInvalid, spend_login_link
from web.rendering import page
from web.sessions import end_session, start_session

router = APIRouter()

# Before there is a session, the operator's form is protected by a double submit: a random value in
# this cookie (SameSite=Strict, so a cross-site form never carries it) must equal the form's field.
LOGIN_CSRF_COOKIE = "kvgate_login_csrf"


def _login_page(
    request: Request, *, status_code: int = 200, error: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    token = request.cookies.get(LOGIN_CSRF_COOKIE) or secrets.token_urlsafe(32)
    response = page(request, "login.html", status_code=status_code, viewer=None, csrf_token=token, error=error)
    response.headers.update(headers or {})
    response.set_cookie(
        LOGIN_CSRF_COOKIE, token, httponly=True, samesite="strict", secure=is_secure(request), path="/login"
    )
    return response


def _logged_in(request: Request, token: str, *, to: str) -> Response:
    response = RedirectResponse(to, status_code=303)
    ttl = timedelta(hours=web_settings(request).session_ttl_hours)
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=int(ttl.total_seconds()),
        httponly=True,
        samesite="lax",
        secure=is_secure(request),
        path="/",
    )
    response.delete_cookie(VIEW_AS_COOKIE, path="/")
    return response


@router.get("/login")
async def login_page(request: Request) -> Response:
    return _login_page(request)


@router.post("/login")
async def operator_login(
    request: Request,
    gw: GatewayDep,
    admin_token: Annotated[str, Form(max_length=512)] = "",
    csrf_token: Annotated[str, Form(alias=CSRF_FIELD, max_length=128)] = "",
) -> Response:
    expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not expected or not csrf_token or not constant_time_equal(csrf_token, expected):
        return _login_page(request, status_code=403, error="The form expired. Please try again.")
    address = request.client.host if request.client else ""
    try:
        gw.admin_attempts.check(address)
    except RateLimitError as exc:
        return _login_page(request, status_code=429, error=exc.message, headers=exc.headers)
    if not admin_token or not gw.admin.verify(admin_token):
        if admin_token:
            gw.admin_attempts.failed(address)
        return _login_page(request, status_code=401, error="That is not the admin token.")
    gw.admin_attempts.succeeded(address)
    async with gw.sessions() as session:
        token = await start_session(
            session, member_id=None, ttl=timedelta(hours=web_settings(request).session_ttl_hours)
        )
    return _logged_in(request, token, to="/admin")


@router.get("/login/{token}")
async def magic_link(request: Request, token: str, gw: GatewayDep) -> Response:
    async with gw.sessions() as session:
        try:
            member = await spend_login_link(session, token=token)
        except LoginLinkInvalid as exc:
            return page(request, "login_link_invalid.html", status_code=400, viewer=None, message=str(exc))
        session_token = await start_session(
            session, member_id=member.id, ttl=timedelta(hours=web_settings(request).session_ttl_hours)
        )
    return _logged_in(request, session_token, to="/")


@router.post("/logout")
async def logout(request: Request, viewer: CsrfViewerDep, gw: GatewayDep) -> Response:
    async with gw.sessions() as session:
        await end_session(session, token_hash=viewer.session_hash)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    response.delete_cookie(VIEW_AS_COOKIE, path="/")
    return response
