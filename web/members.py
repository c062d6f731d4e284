"""Members of a tenant and their single-use login links: invite, list, remove, issue and spend a link.

A link's token is random and shown once (printed, returned, or mailed); only its SHA-256 is stored.
Spending it is one conditional UPDATE, so two browsers opening the same link cannot both log in.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.security import hash_secret, new_id
from kvgate.db import utcnow
from kvgate.errors import InvalidRequestError, NotFoundError
from kvgate.tenancy import MEMBER_ROLES, Member, Tenant
from web.models import LoginLink, WebSession

LINK_PATH = "/login/"
# An address with one @, no spaces, and a dot in its domain: enough to catch typos, not a validator.
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_LINK_RANDOM_BYTES = 32


class LoginLinkInvalid(Exception):
    """The link is unknown, already used, expired, or its member was removed (the message says which)."""


@dataclass(frozen=True)
class Invitation:
    member: Member
    login_url: str
    expires_at: datetime


def normalize_email(email: str) -> str:
    value = email.strip().lower()
    if len(value) > 320 or not value.isprintable() or not _EMAIL.match(value):
        raise InvalidRequestError(f"{email!r} is not an email address", param="email")
    return value


def check_role(role: str) -> str:
    if role not in MEMBER_ROLES:
        raise InvalidRequestError(f"role must be one of {', '.join(MEMBER_ROLES)}", param="role")
    return role


async def invite_member(session: AsyncSession, *, tenant_id: str, email: str, role: str) -> Member:
    """The tenant's member with this email, created if new (or re-admitted if removed), with `role`."""
    address, role = normalize_email(email), check_role(role)
    if await session.get(Tenant, tenant_id) is None:
        raise NotFoundError(f"tenant {tenant_id!r} not found")
    member = await session.scalar(select(Member).where(Member.tenant_id == tenant_id, Member.email == address))
    if member is None:
        member = Member(id=new_id("mem"), tenant_id=tenant_id, email=address, role=role)
        session.add(member)
    else:
        member.role = role
        member.removed_at = None
    await session.commit()
    return member


async def list_members(session: AsyncSession, *, tenant_id: str) -> list[Member]:
    if await session.get(Tenant, tenant_id) is None:
        raise NotFoundError(f"tenant {tenant_id!r} not found")
    query = select(Member).where(Member.tenant_id == tenant_id, Member.removed_at.is_(None))
    return list(await session.scalars(query.order_by(Member.created_at, Member.id)))


async def get_member(session: AsyncSession, *, tenant_id: str, member_id: str) -> Member:
    """A current member of this tenant; another tenant's member id is simply not found."""
    member = await session.get(Member, member_id)
    if member is None or member.tenant_id != tenant_id or member.removed_at is not None:
        raise NotFoundError(f"member {member_id!r} not found")
    return member


async def remove_member(session: AsyncSession, *, tenant_id: str, member_id: str) -> Member:
    """Remove a member: their sessions end now and their unused links stop working."""
    member = await get_member(session, tenant_id=tenant_id, member_id=member_id)
    now = utcnow()
    member.removed_at = now
    await session.execute(
        update(WebSession)
        .where(WebSession.member_id == member.id, WebSession.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    await session.execute(delete(LoginLink).where(LoginLink.member_id == member.id, LoginLink.used_at.is_(None)))
    await session.commit()
    return member


async def issue_login_link(
    session: AsyncSession, *, member: Member, base_url: str, ttl: timedelta
) -> tuple[str, datetime]:
    """A fresh single-use login URL for `member` and when it expires."""
    token = secrets.token_urlsafe(_LINK_RANDOM_BYTES)
    expires_at = utcnow() + ttl
    # The newest link is the only one that works: one forwarded or left in an old mail is dead.
    await session.execute(delete(LoginLink).where(LoginLink.member_id == member.id, LoginLink.used_at.is_(None)))
    session.add(LoginLink(token_hash=hash_secret(token), member_id=member.id, expires_at=expires_at))
    await session.commit()
    return f"{base_url.rstrip('/')}{LINK_PATH}{token}", expires_at


async def spend_login_link(session: AsyncSession, *, token: str) -> Member:
    """The member a link logs in, marking it used; LoginLinkInvalid if it cannot be used (again)."""
    digest = hash_secret(token)
    now = utcnow()
    spent = await session.execute(
        update(LoginLink)
        .where(LoginLink.token_hash == digest, LoginLink.used_at.is_(None), LoginLink.expires_at > now)
        .values(used_at=now)
    )
    if spent.rowcount != 1:  # type: ignore[attr-defined]
        await session.rollback()
        link = await session.get(LoginLink, digest)
        if link is None:
            raise LoginLinkInvalid("This login link is not valid. It may have been mistyped, or replaced.")
        if link.used_at is not None:
            raise LoginLinkInvalid("This login link has already been used. Each link works once.")
        raise LoginLinkInvalid("This login link has expired. Links are valid for a short time only.")
    link = await session.get(LoginLink, digest)
    member = await session.get(Member, link.member_id) if link is not None else None
    if member is None or member.removed_at is not None:
        await session.rollback()
        raise LoginLinkInvalid("This member no longer has access to the dashboard.")
    member.last_login_at = now
    await session.commit()
    return member


async def invite_with_link(
    session: AsyncSession, *, tenant_id: str, email: str, role: str, base_url: str, ttl: timedelta
) -> Invitation:
    """Invite (or re-invite) a member and issue their login link: what `kvgate members invite` and the admin API do."""
    member = await invite_member(session, tenant_id=tenant_id, email=email, role=role)
    url, expires_at = await issue_login_link(session, member=member, base_url=base_url, ttl=ttl)
    return Invitation(member=member, login_url=url, expires_at=expires_at)
