"""Browser sessions: started by a spent login link (a member) or the admin token (the operator), ended by
logout, by expiry, or by the member's removal. The cookie holds a random token; the table only its hash."""

from __future__ import annotations

import secrets
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.security import hash_secret
from kvgate.db import utcnow
from web.models import WebSession

_TOKEN_BYTES = 32


async def start_session(session: AsyncSession, *, member_id: str | None, ttl: timedelta) -> str:
    """A new session for a member (None: the operator); returns the cookie's token."""
    token = secrets.token_urlsafe(_TOKEN_BYTES)
    session.add(
        WebSession(
            token_hash=hash_secret(token),
            member_id=member_id,
            csrf_token=secrets.token_urlsafe(_TOKEN_BYTES),
            expires_at=utcnow() + ttl,
        )
    )
    await session.commit()
    return token


async def end_session(session: AsyncSession, *, token_hash: str) -> None:
    await session.execute(
        update(WebSession)
        .where(WebSession.token_hash == token_hash, WebSession.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    await session.commit()
