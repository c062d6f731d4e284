"""Admin API for a tenant's dashboard members, under /admin/v1/tenants/{tenant_id}/members (admin token)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from gateway.api.deps import SessionDep
from gateway.api.responses import json_response
from gateway.protocols.common import Strict
from gateway.services.tenants import get_tenant
from web import members
from web.deps import base_url, web_settings
from web.mail import MAIL_ERRORS, send_login_link

router = APIRouter(prefix="/tenants/{tenant_id}/members", tags=["admin"])


class MemberInvite(Strict):
    email: str = Field(min_length=3, max_length=320)
    role: Literal["viewer", "billing", "admin"] = "viewer"


class MemberOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    tenant_id: str
    email: str
    role: str
    created_at: datetime
    last_login_at: datetime | None


class MemberList(BaseModel):
    data: list[MemberOut]


class MemberLink(MemberOut):
    login_url: str = Field(description="A single-use login link. Shown only once.")
    login_url_expires_at: datetime
    emailed: bool = Field(description="Whether the link was also mailed (KVGATE_SMTP_URL is set).")
    mail_error: str | None = Field(None, description="Why mailing failed (the link above still works).")


async def _link_out(request: Request, invitation: members.Invitation, *, tenant_name: str) -> MemberLink:
    emailed, mail_error = False, None
    try:
        emailed = await send_login_link(
            web_settings(request), to=invitation.member.email, url=invitation.login_url, tenant_name=tenant_name
        )
    except MAIL_ERRORS as exc:
        mail_error = f"{type(exc).__name__}: {exc}"
    return MemberLink(
        **MemberOut.model_validate(invitation.member).model_dump(),
        login_url=invitation.login_url,
        login_url_expires_at=invitation.expires_at,
        emailed=emailed,
        mail_error=mail_error,
    )


def _ttl(request: Request) -> timedelta:
    return timedelta(minutes=web_settings(request).login_link_ttl_minutes)


@router.post("", status_code=201, response_model=MemberLink)
async def invite_member(tenant_id: str, body: MemberInvite, session: SessionDep, request: Request) -> Response:
    tenant = await get_tenant(session, tenant_id=tenant_id)
    invitation = await members.invite_with_link(
        session, tenant_id=tenant_id, email=body.email, role=body.role, base_url=base_url(request), ttl=_ttl(request)
    )
    return json_response(await _link_out(request, invitation, tenant_name=tenant.name), status_code=201)


@router.get("", response_model=MemberList)
async def list_members(tenant_id: str, session: SessionDep) -> Response:
    rows = await members.list_members(session, tenant_id=tenant_id)
    return json_response(MemberList(data=[MemberOut.model_validate(m) for m in rows]))


@router.post("/{member_id}/remove", response_model=MemberOut)
async def remove_member(tenant_id: str, member_id: str, session: SessionDep) -> Response:
    member = await members.remove_member(session, tenant_id=tenant_id, member_id=member_id)
    return json_response(MemberOut.model_validate(member))


@router.post("/{member_id}/login-links", status_code=201, response_model=MemberLink)
async def new_login_link(tenant_id: str, member_id: str, session: SessionDep, request: Request) -> Response:
    tenant = await get_tenant(session, tenant_id=tenant_id)
    member = await members.get_member(session, tenant_id=tenant_id, member_id=member_id)
    url, expires_at = await members.issue_login_link(
        session, member=member, base_url=base_url(request), ttl=_ttl(request)
    )
    invitation = members.Invitation(member=member, login_url=url, expires_at=expires_at)
    return json_response(await _link_out(request, invitation, tenant_name=tenant.name), status_code=201)
