"""API keys: issue, list, revoke, and authenticate a presented key."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.security import (
    constant_time_equal,
    display_prefix,
    generate_api_key,
    hash_secret,
    looks_like_api_key,
    new_id,
)
from gateway.services.tenants import get_tenant
from kvgate.db import utcnow
from kvgate.db_health import is_database_unavailable
from kvgate.errors import AuthenticationError, NotFoundError, PermissionDeniedError
from kvgate.tenancy import TENANT_ACTIVE, ApiKey, Tenant

# last_used_at is informational; refreshing it at most this often keeps auth read-only
# on the hot path.
LAST_USED_RESOLUTION = timedelta(seconds=60)


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant, the key, and the key's own limits (None: server default)."""

    tenant_id: str
    api_key_id: str
    requests_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    expires_at: datetime | None = None

    def check_expiry(self, now: datetime) -> None:
        if self.expires_at is not None and self.expires_at <= now:
            raise AuthenticationError("this API key has expired")


async def create_key(
    session: AsyncSession,
    *,
    tenant_id: str,
    name: str,
    expires_at: datetime | None = None,
    requests_per_minute: int | None = None,
    input_tokens_per_minute: int | None = None,
) -> tuple[ApiKey, str]:
    """Issue a key. The plaintext is returned here once and never stored."""
    await get_tenant(session, tenant_id=tenant_id)
    plaintext = generate_api_key()
    key = ApiKey(
        id=new_id("key"),
        tenant_id=tenant_id,
        name=name,
        key_hash=hash_secret(plaintext),
        prefix=display_prefix(plaintext),
        expires_at=expires_at,
        requests_per_minute=requests_per_minute,
        input_tokens_per_minute=input_tokens_per_minute,
    )
    session.add(key)
    await session.commit()
    return key, plaintext


async def list_keys(session: AsyncSession, *, tenant_id: str) -> list[ApiKey]:
    await get_tenant(session, tenant_id=tenant_id)
    result = await session.scalars(
        select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at, ApiKey.id)
    )
    return list(result)


async def revoke_key(session: AsyncSession, *, key_id: str) -> ApiKey:
    key = await session.get(ApiKey, key_id)
    if key is None:
        raise NotFoundError(f"API key {key_id!r} not found")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        await session.commit()
    return key


def _invalid() -> AuthenticationError:
    return AuthenticationError("invalid x-api-key")


async def authenticate(
    session: AsyncSession, *, presented: str, now: datetime | None = None, digest: str | None = None
) -> Principal:
    """The principal for a presented key; 401 if unknown, revoked or expired, 403 if suspended."""
    if not looks_like_api_key(presented):
        raise _invalid()
    now = now or utcnow()
    digest = digest or hash_secret(presented)
    row = (
        await session.execute(
            select(ApiKey, Tenant.status).join(Tenant, Tenant.id == ApiKey.tenant_id).where(ApiKey.key_hash == digest)
        )
    ).first()
    # The lookup is by hash, so this comparison only guards against a database that
    # matches loosely (collations); compare_digest keeps it constant-time regardless.
    if row is None or not constant_time_equal(row[0].key_hash, digest):
        raise _invalid()
    key, tenant_status = row
    principal = Principal(
        tenant_id=key.tenant_id,
        api_key_id=key.id,
        requests_per_minute=key.requests_per_minute,
        input_tokens_per_minute=key.input_tokens_per_minute,
        expires_at=key.expires_at,
    )
    if key.revoked_at is not None:
        raise AuthenticationError("this API key has been revoked")
    principal.check_expiry(now)
    if tenant_status != TENANT_ACTIVE:
        raise PermissionDeniedError("this organization has been suspended")
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        try:
            await session.execute(update(ApiKey).where(ApiKey.id == key.id).values(last_used_at=now))
            await session.commit()
        except Exception as error:
            # Informational: the key was just read and is valid; a lost update is not a failed request.
            if not is_database_unavailable(error):
                raise
            with contextlib.suppress(Exception):  # the connection may be gone too
                await session.rollback()
    return principal
