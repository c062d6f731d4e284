"""Mailing login links over SMTP, when KVGATE_SMTP_URL is set."""

from __future__ import annotations

import asyncio
import smtplib
import ssl
from collections.abc import Sequence
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

from web.settings import WebSettings

SMTP_TIMEOUT_S = 30.0
# What a failed delivery raises (smtplib's errors are OSErrors; a malformed URL is a ValueError).
MAIL_ERRORS = (OSError, ValueError)


def login_message(*, sender: str, to: str, url: str, tenant_name: str, valid_minutes: float) -> EmailMessage:
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = f"Your kvgate login link for {tenant_name}"
    message.set_content(
        f"Open this link to log in to the {tenant_name} dashboard on kvgate:\n\n{url}\n\n"
        f"It works once, within {valid_minutes:g} minutes. If you did not expect it, ignore this mail.\n"
    )
    return message


def _send(smtp_url: str, message: EmailMessage) -> None:
    parts = urlsplit(smtp_url)
    tls = parts.scheme == "smtps"
    starttls = parts.scheme == "smtp+starttls"
    if parts.scheme not in ("smtp", "smtps", "smtp+starttls") or not parts.hostname:
        raise ValueError("KVGATE_SMTP_URL must be smtp://, smtps:// or smtp+starttls://host[:port]")
    port = parts.port or (465 if tls else 587 if starttls else 25)
    client_class = smtplib.SMTP_SSL if tls else smtplib.SMTP
    with client_class(parts.hostname, port, timeout=SMTP_TIMEOUT_S) as client:
        if starttls:
            client.starttls(context=ssl.create_default_context())
        if parts.username:
            client.login(unquote(parts.username), unquote(parts.password or ""))
        client.send_message(message)


async def send_login_link(settings: WebSettings, *, to: str, url: str, tenant_name: str) -> bool:
    """Mail `url` to `to`; False (nothing sent) when no SMTP server is configured."""
    if settings.smtp_url is None:
        return False
    message = login_message(
        sender=settings.smtp_from,
        to=to,
        url=url,
        tenant_name=tenant_name,
        valid_minutes=settings.login_link_ttl_minutes,
    )
    await asyncio.to_thread(_send, settings.smtp_url.get_secret_value(), message)
    return True


async def send_mail(settings: WebSettings, *, to: Sequence[str], subject: str, body: str) -> bool:
    """Mail a plain-text message (alerts use it); False (nothing sent) when no SMTP server is configured."""
    if settings.smtp_url is None:
        return False
    message = EmailMessage()
    message["From"] = settings.smtp_from
    message["To"] = ", ".join(to)
    message["Subject"] = subject
    message.set_content(body)
    await asyncio.to_thread(_send, settings.smtp_url.get_secret_value(), message)
    return True
