"""Values generated once per installation: the salt secret and the admin token."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from gateway.security import constant_time_equal, generate_secret, hash_secret
from kvgate.db import insert_ignore
from kvgate.tenancy import ServerState

SECRET_KEY = "salt_secret"
ADMIN_TOKEN_HASH_KEY = "admin_token_sha256"
ADMIN_TOKEN_PREFIX = "kvgadm-"


async def _get_or_create(session: AsyncSession, *, key: str, value: str) -> tuple[str, bool]:
    """The stored value for key, inserting `value` first if there is none (race-safe)."""
    inserted = await insert_ignore(session, ServerState, {"key": key, "value": value}, ["key"])
    await session.commit()
    if inserted:
        return value, True
    stored = await session.get(ServerState, key)
    assert stored is not None
    return stored.value, False


async def ensure_secret(session: AsyncSession, *, configured: str | None) -> str:
    if configured:
        return configured
    value, _ = await _get_or_create(session, key=SECRET_KEY, value=generate_secret())
    return value


@dataclass(frozen=True)
class AdminTokenVerifier:
    """Checks admin bearer tokens against the configured token or the stored hash."""

    expected_sha256: str

    def verify(self, presented: str) -> bool:
        return constant_time_equal(hash_secret(presented), self.expected_sha256)


async def ensure_admin_token(session: AsyncSession, *, configured: str | None) -> tuple[AdminTokenVerifier, str | None]:
    """The verifier, plus the new plaintext token when this call generated it (to print once)."""
    if configured:
        return AdminTokenVerifier(hash_secret(configured)), None
    token = ADMIN_TOKEN_PREFIX + generate_secret()
    stored, created = await _get_or_create(session, key=ADMIN_TOKEN_HASH_KEY, value=hash_secret(token))
    return AdminTokenVerifier(stored), token if created else None
