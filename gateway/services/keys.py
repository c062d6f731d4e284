"""API keys: issue, list, revoke, and authenticate a presented key."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
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
from kvgate.errors import AuthenticationError, InvalidRequestError, NotFoundError, PermissionDeniedError
from kvgate.tenancy import KEY_SCOPES, SCOPE_INFERENCE, TENANT_ACTIVE, ApiKey, Tenant

# last_used_at is informational; refreshing it at most this often keeps auth read-only
# on the hot path.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    """The scopes in KEY_SCOPES order, each once; an unknown one, or none at all, is a 400."""
    given = list(scopes)
    unknown = [scope for scope in given if scope not in KEY_SCOPES]
    if unknown:
        raise InvalidRequestError(f"unknown scope {unknown[0]!r}: scopes are {', '.join(KEY_SCOPES)}", param="scopes")
    if not given:
        raise InvalidRequestError("a key needs at least one scope", param="scopes")
    return tuple(scope for scope in KEY_SCOPES if scope in given)


def scopes_of(key: ApiKey) -> tuple[str, ...]:
    """A key's scopes as stored (space-separated)."""
    return tuple(key.scopes.split())


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant, the key, its scopes, and the key's own limits (None: server default)."""

    tenant_id: str
    api_key_id: str
    requests_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    expires_at: datetime | None = None
    scopes: tuple[str, ...] = (SCOPE_INFERENCE,)
    scheduling_weight: int = 1  # the tenant's, for the engine's fair queueing

    def check_expiry(self, now: datetime) -> None:
        if self.expires_at is not None and self.expires_at <= now:
            raise AuthenticationError("this API key has expired")

    def require_scope(self, scope: str) -> None:
        """403 unless the key holds `scope` (a valid key without the power, so not a 401)."""
        if scope not in self.scopes:
            raise PermissionDeniedError(
                f"this API key lacks the scope {scope!r} (it has: {', '.join(self.scopes) or 'none'})"
            )


async def create_key(
    session: AsyncSession,
    *,
    tenant_id: str,
    name: str,
    expires_at: datetime | None = None,
    requests_per_minute: int | None = None,
    input_tokens_per_minute: int | None = None,
    scopes: Iterable[str] = (SCOPE_INFERENCE,),
) -> tuple[ApiKey, str]:
    """Issue a key. The plaintext is returned here once and never stored."""
    granted = check_scopes(scopes)
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
        scopes=" ".join(granted),
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


async def set_scopes(session: AsyncSession, *, key_id: str, scopes: Iterable[str]) -> ApiKey:
    """Replace a key's scopes (the caller evicts it from the auth cache)."""
    granted = check_scopes(scopes)
    key = await session.get(ApiKey, key_id)
    if key is None:
        raise NotFoundError(f"API key {key_id!r} not found")
    key.scopes = " ".join(granted)
    await session.commit()
    return key


INVALID_KEY = "invalid x-api-key"  # gateway.api.deps words it for a Bearer key


def _invalid() -> AuthenticationError:
    return AuthenticationError(INVALID_KEY)


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
            select(ApiKey, Tenant.status, Tenant.scheduling_weight)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.key_hash == digest)
        )
    ).first()
    # The lookup is by hash, so this comparison only guards against a database that
    # matches loosely (collations); compare_digest keeps it constant-time regardless.
    if row is None or not constant_time_equal(row[0].key_hash, digest):
        raise _invalid()
    key, tenant_status, weight = row
    principal = Principal(
        tenant_id=key.tenant_id,
        api_key_id=key.id,
        requests_per_minute=key.requests_per_minute,
        input_tokens_per_minute=key.input_tokens_per_minute,
        expires_at=key.expires_at,
        scopes=scopes_of(key),
        scheduling_weight=weight or 1,
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
