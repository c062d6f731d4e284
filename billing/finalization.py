"""Finalizing the month's invoices once their grace period is over (the upkeep loop, the API and the CLI)."""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import invoices, operations
from billing.settings import BillingSettings
from billing.vat_in_eur import MissingExchangeRateError

log = structlog.get_logger(__name__)


async def finalize_due(
    *, sessions: async_sessionmaker[AsyncSession], settings: BillingSettings, now: datetime
) -> list[invoices.InvoiceView]:
    """Finalize every draft past its month plus the grace period, one transaction each; push each to
    Stripe when auto-push is on. A draft another process finalized first is skipped."""
    async with sessions() as session:
        due = await invoices.due_for_finalization(
            session=session, now=now, grace=timedelta(days=settings.invoice_grace_days)
        )
        await session.commit()
    views = []
    for invoice_id in due:
        async with sessions() as session:
            try:
                view = await invoices.finalize_invoice(
                    session=session,
                    invoice_id=invoice_id,
                    number_prefix=settings.invoice_number_prefix,
                    now=now,
                    seller=settings.seller_profile(),
                    payment_terms_days=settings.payment_terms_days,
                )
                await session.commit()
            except (invoices.InvoiceStateError, sa_exc.IntegrityError):
                continue  # another process finalized it first
            except MissingExchangeRateError as exc:  # stays a draft until the operator loads the rate
                log.warning("billing.invoice_needs_exchange_rate", invoice_id=invoice_id, error=exc.message)
                continue
        views.append(view)
        log.info("billing.invoice_finalized", invoice_id=invoice_id, number=view.invoice.number)
        await operations.auto_push(sessions=sessions, settings=settings, invoice_id=invoice_id)
    return views
