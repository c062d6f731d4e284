"""Billing's tables. Migration 0002_billing creates them (plus the immutability triggers).

Money columns are BigInteger pico-dollars (1e-12 USD) or cents; prices are kept as
the decimal text they were entered as. Nothing here is ever a float.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    Boolean,
    Date,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from kvgate.db import Base, UTCDateTime, utcnow

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
IdType = BigInteger().with_variant(Integer(), "sqlite")


class DecimalText(TypeDecorator[Decimal]):
    """An exact decimal stored as text: SQLite's NUMERIC would turn it into a float."""

    impl = String(40)
    cache_ok = True

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if not isinstance(value, Decimal) or not value.is_finite():
            raise ValueError(f"expected a finite Decimal, got {value!r}")
        return str(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Decimal | None:
        return None if value is None else Decimal(value)


class PriceVersionRow(Base):
    __tablename__ = "price_versions"
    __table_args__ = (UniqueConstraint("model", "effective_from"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(200))
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime())
    input_usd_per_mtok: Mapped[Decimal] = mapped_column(DecimalText())
    output_usd_per_mtok: Mapped[Decimal] = mapped_column(DecimalText())
    cache_write_5m_multiplier: Mapped[Decimal] = mapped_column(DecimalText())
    cache_write_1h_multiplier: Mapped[Decimal] = mapped_column(DecimalText())
    cache_read_multiplier: Mapped[Decimal] = mapped_column(DecimalText())
    cache_write_24h_multiplier: Mapped[Decimal | None] = mapped_column(DecimalText(), default=None)
    # Added by migration 0006, which gave the versions before it the default multipliers.
    cache_write_30m_multiplier: Mapped[Decimal] = mapped_column(DecimalText())
    cache_write_12h_multiplier: Mapped[Decimal] = mapped_column(DecimalText())
    # The share of every rate a batch request pays (migration 0009; versions before it: 0.5).
    batch_multiplier: Mapped[Decimal] = mapped_column(DecimalText(), default=Decimal("0.5"), server_default="0.5")
    source: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class LedgerEntry(Base):
    """Append-only: one 'usage' entry per request id, corrections as 'reversal' entries.

    Token counts and costs of a reversal are the negated original. billing_month is
    the month the entry is invoiced in: the month the request started, or the current
    month if that month's invoice was already finalized when the entry arrived.
    """

    __tablename__ = "ledger_entries"
    __table_args__ = (
        UniqueConstraint("request_id", "kind"),
        Index("ix_ledger_entries_tenant_month", "tenant_id", "billing_month"),
        Index("ix_ledger_entries_tenant_started", "tenant_id", "started_at"),
        Index("ix_ledger_entries_key_started", "api_key_id", "started_at"),
        # The dashboard's Requests page: a tenant's entries newest first, paged by id.
        Index("ix_ledger_entries_tenant_id_id", "tenant_id", "id"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    api_key_id: Mapped[str | None] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    billing_month: Mapped[date] = mapped_column(Date)
    price_version_id: Mapped[int] = mapped_column(ForeignKey("price_versions.id"))
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_write_5m_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_write_1h_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_write_24h_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_write_30m_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_write_12h_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_pico: Mapped[int] = mapped_column(BigInteger)
    uncached_cost_pico: Mapped[int] = mapped_column(BigInteger)
    ttft_ms: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[int | None] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(500))
    # A batch item's entry (migration 0009): its cost is at the price version's batch rates.
    batch: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class UsageRollup(Base):
    """The ledger summed per tenant, UTC hour, key, model, endpoint and status, kept in the ledger
    writer's transaction, so summaries read a month of requests in hundreds of rows.

    Reversals are added with their (negative) amounts and count no request; an entry without a key
    is rolled up under api_key_id "" (a primary key column cannot be NULL).
    """

    __tablename__ = "usage_rollups"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "hour", "api_key_id", "model", "endpoint", "status"),
        Index("ix_usage_rollups_hour", "hour"),
    )

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    hour: Mapped[datetime] = mapped_column(UTCDateTime())
    api_key_id: Mapped[str] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32))
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_write_5m_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_write_1h_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_write_24h_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_write_30m_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_write_12h_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_pico: Mapped[int] = mapped_column(BigInteger, default=0)
    uncached_cost_pico: Mapped[int] = mapped_column(BigInteger, default=0)


class TenantBudget(Base):
    __tablename__ = "tenant_budgets"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    monthly_limit_pico: Mapped[int | None] = mapped_column(BigInteger)
    # When set, requests also need unspent prepaid credit (credit_granted_pico minus all spend).
    prepaid: Mapped[bool] = mapped_column(Boolean, default=False)
    credit_granted_pico: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class KeyBudget(Base):
    __tablename__ = "key_budgets"

    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    monthly_limit_pico: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class CreditGrant(Base):
    __tablename__ = "credit_grants"

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    amount_pico: Mapped[int] = mapped_column(BigInteger)
    note: Mapped[str] = mapped_column(String(500))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class BudgetCounter(Base):
    """Running spend and outstanding reservations of one budget scope in one period.

    scope: 'tenant_month' / 'key_month' (period 'YYYY-MM') or 'tenant_credit' (period 'all').
    Admission raises reserved_pico with a conditional UPDATE, which is what keeps
    concurrent requests from overrunning a limit.
    """

    __tablename__ = "budget_counters"
    __table_args__ = (PrimaryKeyConstraint("scope", "owner_id", "period"),)

    scope: Mapped[str] = mapped_column(String(16))
    owner_id: Mapped[str] = mapped_column(String(40))
    period: Mapped[str] = mapped_column(String(7))
    spent_pico: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_pico: Mapped[int] = mapped_column(BigInteger, default=0)


class BudgetReservation(Base):
    """An admitted request's worst-case cost, held against its counters until it settles."""

    __tablename__ = "budget_reservations"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(40))
    api_key_id: Mapped[str | None] = mapped_column(String(40))
    period: Mapped[str] = mapped_column(String(7))
    amount_pico: Mapped[int] = mapped_column(BigInteger)
    # Which counters hold this reservation, comma-separated scopes, so release undoes exactly them.
    scopes: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)


class Invoice(Base):
    """One per tenant per calendar month (UTC). Frozen by trigger once no longer a draft."""

    __tablename__ = "invoices"
    __table_args__ = (UniqueConstraint("tenant_id", "period_start"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    period_start: Mapped[date] = mapped_column(Date)
    status: Mapped[str] = mapped_column(String(16), default="draft")
    number: Mapped[str | None] = mapped_column(String(32), unique=True)
    currency: Mapped[str] = mapped_column(String(3), default="usd")
    requests: Mapped[int | None] = mapped_column(BigInteger)
    total_cents: Mapped[int | None] = mapped_column(BigInteger)
    uncached_cents: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finalized_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    paid_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    payment_failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    stripe_invoice_id: Mapped[str | None] = mapped_column(String(64), unique=True)
    stripe_pushed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Set at finalization (migration 0004): tax on the subtotal (total_cents), the due date, and the
    # buyer and seller profiles and tax treatment as they were then (JSON), so the issued document never changes.
    tax_cents: Mapped[int | None] = mapped_column(BigInteger)
    due_on: Mapped[date | None] = mapped_column(Date)
    parties_json: Mapped[str | None] = mapped_column(Text)
    exact_uncached_pico: Mapped[int | None] = mapped_column(BigInteger)
    # Set at finalization (migration 0012): the VAT in EUR, with the rate, its date and source (JSON;
    # billing/vat_in_eur.py), for an EU seller's invoice with VAT in another currency. None otherwise.
    vat_eur_json: Mapped[str | None] = mapped_column(Text)


class ExchangeRate(Base):
    """An operator-loaded rate into EUR (billing/exchange_rates.py, migration 0012): EUR per unit, on a date."""

    __tablename__ = "exchange_rates"

    currency: Mapped[str] = mapped_column(String(3), primary_key=True)  # ISO 4217, lower case
    rate_date: Mapped[date] = mapped_column(Date, primary_key=True)
    eur_per_unit: Mapped[str] = mapped_column(String(40))  # a Decimal, exact
    source: Mapped[str] = mapped_column(String(200))
    loaded_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class InvoiceLineRow(Base):
    """A finalized invoice's line, written once at finalization (drafts are computed live)."""

    __tablename__ = "invoice_lines"
    __table_args__ = (UniqueConstraint("invoice_id", "position"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    invoice_id: Mapped[int] = mapped_column(ForeignKey("invoices.id"))
    position: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(200))
    category: Mapped[str] = mapped_column(String(32))
    price_version_id: Mapped[int] = mapped_column(ForeignKey("price_versions.id"))
    tokens: Mapped[int] = mapped_column(BigInteger)
    unit_price_usd_per_mtok: Mapped[Decimal] = mapped_column(DecimalText())
    exact_amount_pico: Mapped[int] = mapped_column(BigInteger)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    # A line of batch requests, at the batch rates (migration 0009).
    batch: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class BillingProfileRow(Base):
    """A tenant's billing profile: the invoice's buyer block and tax treatment (migration 0004)."""

    __tablename__ = "billing_profiles"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    legal_name: Mapped[str] = mapped_column(String(200))
    email: Mapped[str | None] = mapped_column(String(320))
    address_line1: Mapped[str | None] = mapped_column(String(200))
    address_line2: Mapped[str | None] = mapped_column(String(200))
    address_city: Mapped[str | None] = mapped_column(String(100))
    address_postal_code: Mapped[str | None] = mapped_column(String(20))
    address_state: Mapped[str | None] = mapped_column(String(100))
    address_country: Mapped[str | None] = mapped_column(String(2))
    tax_id_type: Mapped[str | None] = mapped_column(String(32))
    tax_id_value: Mapped[str | None] = mapped_column(String(64))
    currency: Mapped[str] = mapped_column(String(3), default="usd")
    po_number: Mapped[str | None] = mapped_column(String(64))
    tax_treatment: Mapped[str] = mapped_column(String(16))
    tax_rate_percent: Mapped[Decimal | None] = mapped_column(DecimalText())
    tax_note: Mapped[str | None] = mapped_column(String(500))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class CreditNote(Base):
    __tablename__ = "credit_notes"

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    invoice_id: Mapped[int] = mapped_column(ForeignKey("invoices.id"), index=True)
    number: Mapped[str] = mapped_column(String(32), unique=True)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class BillingSequence(Base):
    """Gapless document numbers: the row is locked and bumped in the transaction that uses it."""

    __tablename__ = "billing_sequences"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_value: Mapped[int] = mapped_column(BigInteger, default=0)


class StripeCustomer(Base):
    __tablename__ = "stripe_customers"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    stripe_customer_id: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class StripeInvoiceItem(Base):
    """Which Stripe invoice item carries which of our lines: the app-level dedupe for pushes."""

    __tablename__ = "stripe_invoice_items"

    invoice_line_id: Mapped[int] = mapped_column(ForeignKey("invoice_lines.id"), primary_key=True)
    stripe_invoice_item_id: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookEvent(Base):
    """Every verified webhook event, once: the unique (source, event_id) makes handling idempotent."""

    __tablename__ = "webhook_events"
    __table_args__ = (UniqueConstraint("source", "event_id"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(32))
    event_id: Mapped[str] = mapped_column(String(128))
    event_type: Mapped[str] = mapped_column(String(128))
    payload: Mapped[str] = mapped_column(Text)
    outcome: Mapped[str] = mapped_column(String(200))
    received_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class StripeCreditNote(Base):
    """Which Stripe credit note carries which of ours (migration 0004): the dedupe for pushing them."""

    __tablename__ = "stripe_credit_notes"

    credit_note_id: Mapped[int] = mapped_column(ForeignKey("credit_notes.id"), primary_key=True)
    stripe_credit_note_id: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
