"""Alerts as mail: the message, and the sender the composition root hands in (web's SMTP code)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from alerts.models import AlertEvent


class MailSender(Protocol):
    async def __call__(self, *, to: Sequence[str], subject: str, body: str) -> bool:
        """Send one message; False when no SMTP server is configured. A failed send raises."""
        ...


def alert_mail(event: AlertEvent, *, tenant_name: str) -> tuple[str, str]:
    """The subject and body of an alert's mail."""
    payload = json.loads(event.body)
    subject = f"kvgate alert for {tenant_name}: {event.summary}"[:200]
    body = (
        f"{event.summary}\n\n"
        f"Tenant: {tenant_name} ({event.tenant_id})\n"
        f"Alert: {payload['type']} (id {event.id})\n"
        f"Fired: {event.created_at:%Y-%m-%d %H:%M} UTC\n\n"
        f"Details:\n{json.dumps(payload['data'], indent=2, sort_keys=True)}\n\n"
        "Choose which alerts you get on the dashboard's Alerts page.\n"
    )
    return subject, body
