"""The alerts' tables (migration 0010_alerts): each tenant's choices, its webhook endpoints, every alert that
fired (once per tenant, kind and period), one delivery per alert and target, and each delivery attempt."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from kvgate.db import Base, UTCDateTime, utcnow

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a bigint identity.
IdType = BigInteger().with_variant(Integer(), "sqlite")


class AlertSettingsRow(Base):
    """Which alert kinds a tenant wants, and who is mailed. No row: no alerts."""

    __tablename__ = "alert_settings"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    # Space-separated alerts.kinds names.
    kinds: Mapped[str] = mapped_column(String(200))
    # Comma-separated addresses, lower-cased.
    email_recipients: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AlertEndpoint(Base):
    """A webhook URL. The secret signs every delivery; it is shown once, at creation (like Stripe's whsec_)."""

    __tablename__ = "alert_endpoints"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    # Kept as it is (not hashed): signing needs it.
    secret: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class AlertEvent(Base):
    """One alert that fired. The unique (tenant, kind, period) is the dedupe: a restarted or second evaluator
    inserting it again inserts nothing and sends nothing."""

    __tablename__ = "alert_events"
    __table_args__ = (
        UniqueConstraint("tenant_id", "kind", "period", name="uq_alert_events_tenant_kind_period"),
        Index("ix_alert_events_tenant_created", "tenant_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    # What it fires once for: "tenant_month:<tenant>:2026-01", an hour's ISO start, ...
    period: Mapped[str] = mapped_column(String(200))
    summary: Mapped[str] = mapped_column(String(500))
    # The webhook body, exactly as signed and sent on every attempt.
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AlertDelivery(Base):
    """An alert's delivery to one webhook endpoint or to the tenant's mail recipients: pending until delivered
    or out of attempts. attempts and next_attempt_at move together in one conditional UPDATE (a claim)."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "target", name="uq_alert_deliveries_event_target"),
        Index("ix_alert_deliveries_state_next", "state", "next_attempt_at"),
        Index("ix_alert_deliveries_tenant_created", "tenant_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("alert_events.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    # "webhook" or "email".
    channel: Mapped[str] = mapped_column(String(16))
    endpoint_id: Mapped[str | None] = mapped_column(ForeignKey("alert_endpoints.id", ondelete="CASCADE"))
    # The endpoint's URL, or the comma-separated recipients, as they were when the alert fired.
    target: Mapped[str] = mapped_column(String(2048))
    # "pending", "delivered" or "failed".
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class AlertAttempt(Base):
    """One try at a delivery: when, what the receiver answered (or why there was no answer)."""

    __tablename__ = "alert_attempts"
    __table_args__ = (UniqueConstraint("delivery_id", "attempt", name="uq_alert_attempts_delivery_attempt"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(ForeignKey("alert_deliveries.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime())
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(500))
