"""Who is calling: the presented key, checked against the auth cache, the database, and during a
database outage the last-known-good cache.

- A fresh cache entry is used as is (expiry still checked), without awaiting anything.
- Otherwise the database decides (one lookup per key at a time, shared by concurrent requests);
  a key it refuses is evicted from the cache.
- If the database cannot be reached (or is known to be down and no probe is due), a key
  the database accepted within KVGATE_AUTH_STALE_TTL_S keeps working; any other key gets a
  retryable 529/503, never a 401, since it may well be valid.
"""

from __future__ import annotations

from gateway.security import hash_secret, looks_like_api_key
from gateway.services.keys import INVALID_KEY, Principal, authenticate
from gateway.state import Gateway
from kvgate.db import utcnow
from kvgate.errors import AuthenticationError, PermissionDeniedError, database_unavailable_error


async def resolve_principal(gw: Gateway, *, presented: str, path: str) -> Principal:
    """The principal for a presented API key, or a 401/403, or a retryable error during an outage."""
    if not looks_like_api_key(presented):
        raise AuthenticationError(INVALID_KEY)  # no database could make this one valid
    digest = hash_secret(presented)
    principal = gw.auth_cache.get(digest)
    if principal is None:
        # Shared by concurrent requests with this key; the outage fallback is each caller's own,
        # since its error depends on the caller's path.
        found = await gw.auth_cache.load(digest, lambda: _from_database(gw, presented=presented, digest=digest))
        principal = found if found is not None else _last_known_good(gw, digest=digest, path=path)
    principal.check_expiry(utcnow())
    return principal


async def _from_database(gw: Gateway, *, presented: str, digest: str) -> Principal | None:
    """The database's verdict on the key; None when the database cannot be asked."""
    health = gw.db_health
    if not health.should_try():
        return None
    generation = gw.auth_cache.generation  # read before the row: an eviction after it wins
    try:
        # A short session of its own: a streaming response must not hold a connection.
        async with gw.sessions() as session:
            principal = await authenticate(session, presented=presented, digest=digest)
    except (AuthenticationError, PermissionDeniedError):
        health.succeeded()
        gw.auth_cache.discard(digest)
        raise
    except Exception as error:
        if not health.observe(error):
            raise
        return None
    health.succeeded()
    gw.auth_cache.put(digest, principal, generation=generation)
    return principal


def _last_known_good(gw: Gateway, *, digest: str, path: str) -> Principal:
    principal = gw.auth_cache.get_stale(digest)
    if principal is None:
        raise database_unavailable_error(path)
    return principal
