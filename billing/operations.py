"""Billing's admin operations: one function per write (or multi-step read), shared by the API and the CLI.

Each takes an open session (or, where it spans several transactions, the session factory) and
owns its transaction: it commits what it changed. Reads that are one domain call
(`usage_queries.list_usage`, `catalog.list_versions`, `invoices.view_invoice`, ...) are called
directly. Failures are `billing.errors.BillingDomainError`s, which carry their HTTP status.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

import stripe
import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import budget_limits, budgets, catalog, credit_notes, invoices, profiles, stripe_sync, tax_rules
from billing.budgets import BudgetStatus, UnknownOwnerError
from billing.catalog import SeedResult
from billing.credit_note_documents import CreditNoteDocument, credit_note_documents
from billing.errors import NotConfiguredError
from billing.models import CreditGrant, CreditNote, KeyBudget
from billing.prices import PriceChange, PriceVersion, load_price_file
from billing.render import InvoiceDocument
from billing.settings import BillingSettings
from billing.settlement import Settlement, reverse_charge
from kvgate.tenancy import ApiKey, Tenant

log = structlog.get_logger(__name__)

# -- usage ------------------------------------------------------------------------------------


async def reverse_usage(*, session: AsyncSession, request_id: str, reason: str) -> Settlement:
    """Cancel a request's charge (idempotent: a second call finds the first reversal)."""
    settlement = await reverse_charge(session=session, request_id=request_id, reason=reason)
    await session.commit()
    return settlement


# -- prices -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AddedPrice:
    version: PriceVersion
    carried_over: tuple[str, ...]
    """The price fields the change left out, taken from the version before it (`carried_from`)."""
    carried_from: int | None


async def add_price(*, session: AsyncSession, change: PriceChange, source: str) -> AddedPrice:
    """A new price version (a change never edits an old one); PriceConflictError if it clashes.

    What the change leaves out is carried over from the model's version before it, and named
    in the result so the caller can warn: a new input price never silently drops a cache class.
    """
    previous = await catalog.version_before(session=session, model=change.model, at=change.effective_from)
    resolved = change.resolve(previous)
    version = await catalog.add_version(session=session, spec=resolved.spec, source=source)
    await session.commit()
    carried_from = previous.id if previous is not None and resolved.carried_over else None
    return AddedPrice(version=version, carried_over=resolved.carried_over, carried_from=carried_from)


async def seed_prices(*, session: AsyncSession, path: Path) -> SeedResult:
    """Load a TOML price file into the catalog (idempotent)."""
    result = await catalog.seed_prices(session=session, specs=load_price_file(path), source=path.name)
    await session.commit()
    return result


# -- budgets and credit -----------------------------------------------------------------------


async def _require_tenant(session: AsyncSession, tenant_id: str) -> None:
    if await session.get(Tenant, tenant_id) is None:
        raise UnknownOwnerError(f"no tenant {tenant_id}")


async def budget_status(*, session: AsyncSession, tenant_id: str) -> BudgetStatus:
    await _require_tenant(session, tenant_id)
    return await budgets.budget_status(session=session, tenant_id=tenant_id)


async def set_tenant_budget(
    *, session: AsyncSession, tenant_id: str, monthly_limit_pico: int | None, prepaid: bool | None
) -> BudgetStatus:
    """Set a tenant's monthly limit (None: no limit) and, unless None, its prepaid mode."""
    await _require_tenant(session, tenant_id)
    await budget_limits.set_tenant_budget(
        session=session, tenant_id=tenant_id, monthly_limit_pico=monthly_limit_pico, prepaid=prepaid
    )
    await session.commit()
    return await budgets.budget_status(session=session, tenant_id=tenant_id)


async def set_key_budget(*, session: AsyncSession, key_id: str, monthly_limit_pico: int | None) -> KeyBudget:
    key = await session.get(ApiKey, key_id)
    if key is None:
        raise UnknownOwnerError(f"no API key {key_id}")
    budget = await budget_limits.set_key_budget(
        session=session, tenant_id=key.tenant_id, api_key_id=key_id, monthly_limit_pico=monthly_limit_pico
    )
    await session.commit()
    return budget


async def grant_credit(
    *, session: AsyncSession, tenant_id: str, amount_pico: int, note: str, idempotency_key: str | None
) -> tuple[CreditGrant, bool]:
    """Add prepaid credit; (grant, created): a repeated idempotency key returns the first grant."""
    await _require_tenant(session, tenant_id)
    grant, created = await budget_limits.grant_credit(
        session=session, tenant_id=tenant_id, amount_pico=amount_pico, note=note, idempotency_key=idempotency_key
    )
    await session.commit()
    return grant, created


# -- billing profiles --------------------------------------------------------------------------


async def set_billing_profile(
    *, session: AsyncSession, tenant_id: str, profile: profiles.BillingProfile, seller_country: str | None
) -> profiles.BillingProfile:
    """Replace a tenant's billing profile; invoices finalized before keep the profile they were issued with.
    Its tax treatment must fit its buyer (billing.tax_rules)."""
    tax_rules.check_treatment(profile, seller_country=seller_country)
    await profiles.set_profile(session=session, tenant_id=tenant_id, profile=profile)
    await session.commit()
    return profile


# -- invoices and credit notes ----------------------------------------------------------------------


async def list_invoices(
    *,
    session: AsyncSession,
    tenant_id: str | None,
    status: str | None,
    month: date | None,
    limit: int,
    offset: int = 0,
) -> list[invoices.InvoiceView]:
    """Invoices, newest month first; the drafts of months with usage are created first."""
    await invoices.ensure_drafts(session=session)
    await session.commit()
    rows = await invoices.list_invoices(
        session=session, tenant_id=tenant_id, status=status, month=month, limit=limit, offset=offset
    )
    return [await invoices.view_invoice(session=session, invoice_id=row.id) for row in rows]


async def finalize_invoice(
    *, session: AsyncSession, invoice_id: int, number_prefix: str, settings: BillingSettings | None = None
) -> invoices.InvoiceView:
    """Finalize a draft; with `settings`, the seller's profile and payment terms are recorded on it."""
    extra = {}
    if settings is not None:
        extra = {"seller": settings.seller_profile(), "payment_terms_days": settings.payment_terms_days}
    view = await invoices.finalize_invoice(session=session, invoice_id=invoice_id, number_prefix=number_prefix, **extra)
    await session.commit()
    return view


async def invoice_document(
    *, session: AsyncSession, invoice_id: int, seller: str, settings: BillingSettings | None = None
) -> InvoiceDocument:
    """What the PDF and HTML renderings of an invoice show; `settings` adds the seller's full profile and
    payment instructions (without, the seller is just its name)."""
    view = await invoices.view_invoice(session=session, invoice_id=invoice_id)
    if settings is None:
        return await invoices.invoice_document(session=session, view=view, seller=seller)
    return await invoices.invoice_document(
        session=session,
        view=view,
        seller=settings.seller_profile(),
        payment_instructions=settings.payment_instructions,
        payment_terms_days=settings.payment_terms_days,
    )


async def credit_note_document(
    *, session: AsyncSession, credit_note_id: int, seller: str, settings: BillingSettings | None = None
) -> CreditNoteDocument:
    """A credit note as a document, against its invoice as issued (CreditNoteNotFoundError if none)."""
    note = await credit_notes.get_credit_note(session=session, credit_note_id=credit_note_id)
    invoice = await invoice_document(session=session, invoice_id=note.invoice_id, seller=seller, settings=settings)
    notes = await credit_notes.list_credit_notes(session=session, invoice_id=note.invoice_id)
    # A note's split depends on the notes before it (the last cent takes what is left), never on later ones.
    return credit_note_documents(invoice, [n for n in notes if n.id <= note.id])[-1]


async def issue_credit_note(
    *, session: AsyncSession, invoice_id: int, amount_cents: int, reason: str, number_prefix: str
) -> CreditNote:
    note = await credit_notes.issue_credit_note(
        session=session, invoice_id=invoice_id, amount_cents=amount_cents, reason=reason, number_prefix=number_prefix
    )
    await session.commit()
    return note


async def push_to_stripe(
    *, sessions: async_sessionmaker[AsyncSession], settings: BillingSettings, invoice_id: int
) -> stripe_sync.PushResult:
    """Mirror a finalized invoice in Stripe (its own transactions around each Stripe call)."""
    client = stripe_sync.client_from_settings(settings)
    if client is None:
        raise NotConfiguredError("Stripe is not configured: set STRIPE_API_KEY")
    return await stripe_sync.push_invoice(
        sessions=sessions, client=client, invoice_id=invoice_id, currency=settings.stripe_currency
    )


async def push_due(
    *, sessions: async_sessionmaker[AsyncSession], settings: BillingSettings
) -> list[stripe_sync.PushResult]:
    """Catch up with Stripe: every finalized invoice not yet pushed, and every credit note not yet there."""
    client = stripe_sync.client_from_settings(settings)
    if client is None:
        raise NotConfiguredError("Stripe is not configured: set STRIPE_API_KEY")
    return await stripe_sync.push_due(sessions=sessions, client=client, currency=settings.stripe_currency)


async def auto_push(
    *, sessions: async_sessionmaker[AsyncSession], settings: BillingSettings, invoice_id: int
) -> stripe_sync.PushResult | None:
    """With KVGATE_STRIPE_AUTO_PUSH (and Stripe configured): push a just finalized or credited invoice.

    A failure is logged, not raised: the finalization or credit note stands, and `push-due` (or the
    next auto push) catches up.
    """
    client = stripe_sync.client_from_settings(settings)
    if not settings.stripe_auto_push or client is None:
        return None
    try:
        return await stripe_sync.push_invoice(
            sessions=sessions, client=client, invoice_id=invoice_id, currency=settings.stripe_currency
        )
    except (stripe.StripeError, stripe_sync.StripeSyncError, OSError) as exc:
        log.warning("stripe.auto_push_failed", invoice_id=invoice_id, error=str(exc))
        return None
