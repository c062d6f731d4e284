"""Webhook signatures, the way Stripe signs its own: `kvgate-signature: t=<unix>,v1=<hex>` where hex is the
HMAC-SHA256 of "<t>.<body>" keyed with the endpoint's secret. A receiver recomputes it over the raw body and
refuses an old t, so a captured delivery cannot be replayed later."""

from __future__ import annotations

import hashlib
import hmac
import secrets

SIGNATURE_HEADER = "kvgate-signature"
EVENT_ID_HEADER = "kvgate-event-id"
SECRET_PREFIX = "whsec_"
# How old a signed timestamp a receiver accepts (Stripe's default tolerance).
DEFAULT_TOLERANCE_S = 300


class SignatureError(ValueError):
    """A delivery whose signature header is missing, malformed, stale or does not match."""


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_hex(24)


def signature(secret: str, *, timestamp: int, body: bytes) -> str:
    signed = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(secret: str, *, timestamp: int, body: bytes) -> str:
    return f"t={timestamp},v1={signature(secret, timestamp=timestamp, body=body)}"


def verify(header: str, *, body: bytes, secret: str, now: int, tolerance_s: int = DEFAULT_TOLERANCE_S) -> int:
    """Check a `kvgate-signature` header against the raw body; returns its timestamp or raises SignatureError."""
    parts: dict[str, list[str]] = {}
    for item in header.split(","):
        name, _, value = item.strip().partition("=")
        parts.setdefault(name, []).append(value)
    try:
        timestamp = int(parts["t"][0])
    except (KeyError, ValueError) as exc:
        raise SignatureError("no timestamp in the signature header") from exc
    if abs(now - timestamp) > tolerance_s:
        raise SignatureError("the signature's timestamp is outside the tolerance")
    expected = signature(secret, timestamp=timestamp, body=body)
    if not any(hmac.compare_digest(expected, given) for given in parts.get("v1", [])):
        raise SignatureError("no v1 signature matches the body")
    return timestamp
