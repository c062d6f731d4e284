"""Sending due deliveries: signed webhook POSTs and mail, a bounded number at a time, each attempt logged.

A webhook attempt succeeds on a 2xx answer within the timeout; anything else (another status, a redirect,
which is never followed, a timeout, a refused connection) is retried after RETRY_DELAYS_S, up to
MAX_ATTEMPTS in all (six over about an hour), then the delivery has failed. Every attempt of one alert to
one endpoint carries the same body and event id, newly signed, so a receiver dedupes on the id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import httpx
import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from alerts import store
from alerts.addresses import private_address
from alerts.mail import MailSender, alert_mail
from alerts.models import AlertDelivery, AlertEndpoint, AlertEvent
from alerts.signing import EVENT_ID_HEADER, SIGNATURE_HEADER, signature_header
from kvgate import __version__
from kvgate.db import utcnow
from kvgate.tenancy import Tenant

log = structlog.get_logger(__name__)

# The waits after attempts 1 to 5: 2, 4, 8, 16 and 32 minutes, so the 6th and last comes about an hour in.
RETRY_DELAYS_S = (120, 240, 480, 960, 1920)
MAX_ATTEMPTS = len(RETRY_DELAYS_S) + 1
# A claimed attempt whose process died is retried after this long.
CLAIM_LEASE = timedelta(minutes=2)
BATCH = 100
# Not retried: configuration, not the receiver, is missing.
NO_SMTP = "no SMTP server is configured (KVGATE_SMTP_URL)"
Clock = Callable[[], datetime]


class Deliverer:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        mail: MailSender | None,
        timeout_s: float = 5.0,
        concurrency: int = 8,
        clock: Clock = utcnow,
        transport: httpx.AsyncBaseTransport | None = None,
        allow_private: bool = False,
    ) -> None:
        self.sessions = sessions
        self.allow_private = allow_private  # alerts/addresses.py
        self.mail = mail
        self.clock = clock
        self._limit = asyncio.Semaphore(concurrency)
        # Redirects are not followed: a receiver must not bounce our signed POST to an address we never checked.
        self._client = httpx.AsyncClient(
            timeout=timeout_s,
            follow_redirects=False,
            transport=transport,
            headers={"user-agent": f"kvgate/{__version__}"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def deliver_due(self) -> int:
        """Send every delivery due now (claimed first); returns how many attempts were made."""
        now = self.clock()
        async with self.sessions() as session:
            due = await store.due_deliveries(session, now=now, limit=BATCH)
            claimed = [d for d in due if await store.claim(session, d, now=now, lease=CLAIM_LEASE)]
            await session.commit()
        await asyncio.gather(*(self._attempt(d.id, d.attempts + 1) for d in claimed))
        return len(claimed)

    async def _attempt(self, delivery_id: int, attempt: int) -> None:
        async with self._limit:
            started = self.clock()
            try:
                status_code, error = await self._send(delivery_id)
            except Exception as exc:  # one bad delivery must not stop the others
                log.exception("alerts.delivery_crashed", delivery_id=delivery_id)
                status_code, error = None, f"{type(exc).__name__}: {exc}"
            finished = self.clock()
            retry = error is not None and error != NO_SMTP and attempt < MAX_ATTEMPTS
            async with self.sessions() as session:
                await store.record_attempt(
                    session,
                    delivery_id=delivery_id,
                    attempt=attempt,
                    started_at=started,
                    finished_at=finished,
                    status_code=status_code,
                    error=error,
                    next_attempt_at=started + timedelta(seconds=RETRY_DELAYS_S[attempt - 1]) if retry else None,
                )
                await session.commit()
            log.info("alerts.delivery_attempt", delivery_id=delivery_id, attempt=attempt, status=status_code)

    async def _send(self, delivery_id: int) -> tuple[int | None, str | None]:
        async with self.sessions() as session:
            delivery = await session.get(AlertDelivery, delivery_id)
            assert delivery is not None
            event = await session.get(AlertEvent, delivery.event_id)
            assert event is not None
            if delivery.channel == store.EMAIL:
                tenant = await session.get(Tenant, delivery.tenant_id)
                return None, await self._send_mail(delivery, event, tenant.name if tenant else delivery.tenant_id)
            endpoint = await session.get(AlertEndpoint, delivery.endpoint_id)
        if endpoint is None:
            return None, "the endpoint was removed"
        return await self._post(endpoint, event)

    async def _post(self, endpoint: AlertEndpoint, event: AlertEvent) -> tuple[int | None, str | None]:
        if not self.allow_private:
            refused = await _private_target(endpoint.url)
            if refused is not None:
                return None, refused
        body = event.body.encode()
        headers = {
            "content-type": "application/json",
            SIGNATURE_HEADER: signature_header(endpoint.secret, timestamp=int(self.clock().timestamp()), body=body),
            EVENT_ID_HEADER: event.id,
        }
        try:
            response = await self._client.post(endpoint.url, content=body, headers=headers)
        except httpx.TimeoutException:
            return None, "timed out"
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:500]
        if 200 <= response.status_code < 300:
            return response.status_code, None
        return response.status_code, f"the receiver answered {response.status_code}"

    async def _send_mail(self, delivery: AlertDelivery, event: AlertEvent, tenant_name: str) -> str | None:
        if self.mail is None:
            return NO_SMTP
        subject, body = alert_mail(event, tenant_name=tenant_name)
        try:
            sent = await self.mail(to=delivery.target.split(","), subject=subject, body=body)
        except (OSError, ValueError) as exc:  # smtplib's errors are OSErrors; a malformed URL is a ValueError
            return f"{type(exc).__name__}: {exc}"[:500]
        return None if sent else NO_SMTP


async def _private_target(url: str) -> str | None:
    """Why this URL must not be posted to now (None: its host resolves to public addresses only)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        address = await private_address(host, parts.port or (443 if parts.scheme == "https" else 80))
    except OSError as exc:
        return f"the host {host} does not resolve: {exc}"[:500]
    if address is not None:
        return f"the host {host} resolves to {address}, which is not a public address"
    return None
