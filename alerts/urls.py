"""Webhook URLs are tenant input: only absolute http(s) URLs with a host, no credentials, no whitespace."""

from __future__ import annotations

from urllib.parse import urlsplit

from alerts.addresses import is_public, literal_address
from kvgate.errors import InvalidRequestError

MAX_URL_LENGTH = 2048


def check_webhook_url(url: str, *, allow_private: bool = False) -> str:
    """The URL, stripped, or InvalidRequestError (a 400) saying what is wrong with it. A literal address that
    is not public (loopback, private, link-local...) is refused here at once; a name is checked at each
    attempt (alerts/addresses.py)."""
    url = url.strip()
    if not url:
        raise InvalidRequestError("a webhook endpoint needs a URL")
    if len(url) > MAX_URL_LENGTH:
        raise InvalidRequestError(f"a webhook URL is at most {MAX_URL_LENGTH} characters")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        raise InvalidRequestError("a webhook URL must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise InvalidRequestError(f"not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidRequestError("a webhook URL must start with http:// or https://")
    if not parts.hostname:
        raise InvalidRequestError("a webhook URL must name a host")
    if parts.username is not None or parts.password is not None:
        raise InvalidRequestError("a webhook URL must not carry a user name or password")
    literal = literal_address(parts.hostname)
    if not allow_private and (parts.hostname == "localhost" or (literal is not None and not is_public(literal))):
        raise InvalidRequestError("a webhook URL must reach a public address, not loopback or a private network")
    return url
