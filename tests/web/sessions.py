"""Logged-in dashboard sessions made directly in the database (a member and a web_sessions row),
for page tests that do not exercise the login itself."""

from __future__ import annotations

import secrets
import uuid
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.security import hash_secret
from kvgate.db import utcnow
from kvgate.tenancy import Member
from web.deps import SESSION_COOKIE
from web.models import WebSession


async def member_session(
    sessions: async_sessionmaker[AsyncSession], *, tenant_id: str, role: str = "admin"
) -> dict[str, str]:
    """Cookies of a fresh member of the tenant, logged in."""
    token = secrets.token_urlsafe(32)
    member_id = f"mem_{uuid.uuid4().hex[:16]}"
    async with sessions() as session:
        session.add(Member(id=member_id, tenant_id=tenant_id, email=f"{member_id}@example.com", role=role))
        await session.flush()
        session.add(
            WebSession(
                token_hash=hash_secret(token),
                member_id=member_id,
                csrf_token=secrets.token_urlsafe(16),
                expires_at=utcnow() + timedelta(hours=8),
            )
        )
        await session.commit()
    return {SESSION_COOKIE: token}
