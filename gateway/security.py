"""Secrets: API keys, the admin token, and the per-tenant cache salts."""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "kvg-"
# 32 random bytes give 43 URL-safe characters, above the 40 the format promises.
_KEY_RANDOM_BYTES = 32
DISPLAY_PREFIX_LEN = 12


def new_id(kind: str) -> str:
    """An opaque id such as ten_3f9c... or key_81ab...."""
    return f"{kind}_{secrets.token_hex(12)}"


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(_KEY_RANDOM_BYTES)


def hash_secret(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def display_prefix(key: str) -> str:
    return key[:DISPLAY_PREFIX_LEN]


def looks_like_api_key(value: str) -> bool:
    return value.startswith(KEY_PREFIX) and len(value) >= len(KEY_PREFIX) + 40


def constant_time_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def generate_secret() -> str:
    return secrets.token_urlsafe(32)


def tenant_salt(server_secret: str, tenant_id: str, client_salt: str | None = None) -> str:
    """The engine cache salt for a tenant, optionally partitioned further by a client value.

    Derived server-side so that no client can name another tenant's partition: a
    client value only ever narrows the sharing inside its own tenant. The NUL byte
    keeps ("ab", "c") and ("a", "bc") apart.
    """
    message = tenant_id if client_salt is None else f"{tenant_id}\x00{client_salt}"
    return hmac.new(server_secret.encode(), message.encode(), hashlib.sha256).hexdigest()
