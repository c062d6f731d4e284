"""The tables every package shares: tenants, their API keys and members, usage records and server state.

The gateway writes them; billing reads them (budgets, invoices, Stripe customers).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import Mapped, mapped_column

from kvgate.db import Base, UTCDateTime, utcnow

TENANT_ACTIVE = "active"
TENANT_SUSPENDED = "suspended"

# What a key may do. Keys made before scopes existed hold SCOPE_INFERENCE, their old power.
SCOPE_INFERENCE = "inference"
SCOPE_USAGE_READ = "usage:read"
SCOPE_INVOICES_READ = "invoices:read"
KEY_SCOPES = (SCOPE_INFERENCE, SCOPE_USAGE_READ, SCOPE_INVOICES_READ)

# A member's role on the dashboard: viewers read, billing also edits billing, admins also manage keys.
MEMBER_ROLES = ("viewer", "billing", "admin")


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), default=TENANT_ACTIVE)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Its share of the engine when tenants contend (fair queueing: inference/scheduler.py).
    scheduling_weight: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    # Only the SHA-256 of the key is kept; the key itself is shown once at creation.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, default=None)
    input_tokens_per_minute: Mapped[int | None] = mapped_column(Integer, default=None)
    # Space-separated KEY_SCOPES.
    scopes: Mapped[str] = mapped_column(String(200), default=SCOPE_INFERENCE, server_default=SCOPE_INFERENCE)


class Member(Base):
    """A person who logs in to a tenant's dashboard (by a single-use email link, never by API key)."""

    __tablename__ = "members"
    __table_args__ = (UniqueConstraint("tenant_id", "email", name="uq_members_tenant_email"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    # Stored lower-cased.
    email: Mapped[str] = mapped_column(String(320))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_login_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)


class UsageRecord(Base):
    """One row per finished or abandoned request; the request id makes writes idempotent."""

    __tablename__ = "usage_records"
    # A tenant's refusals by time (the Overview, Requests and the alerts read them; migration 0011).
    __table_args__ = (Index("ix_usage_records_tenant_status_started", "tenant_id", "status", "started_at"),)

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(40), index=True)
    api_key_id: Mapped[str] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_write_5m_tokens: Mapped[int] = mapped_column(BigInteger)
    cache_write_1h_tokens: Mapped[int] = mapped_column(BigInteger)
    # OpenAI's 30m and 12h TTLs (migration 0006; older rows hold 0).
    cache_write_30m_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_write_12h_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # OpenAI's 24h retention; always 0 unless billing prices that TTL class.
    cache_write_24h_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cache_read_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    ttft_ms: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32))
    # Where the request ran (migration 0007): backend "embedded", "kvgate" or "vllm" (whose cache writes are
    # derived by the gateway, gateway/backends/http_wire.py), the engine's id, and the router's predicted reads.
    backend: Mapped[str | None] = mapped_column(String(16))
    engine_id: Mapped[str | None] = mapped_column(String(200))
    predicted_cached_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # A batch item (gateway/batches, migration 0009): billed at the price version's batch rates.
    batch: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # A refused request (status "refused", migration 0011): the limit that refused it and the reserve that
    # did not fit it (pico-dollars; None for a rate limit). gateway/refusals.py writes these.
    refusal_reason: Mapped[str | None] = mapped_column(String(32))
    refusal_reserve_pico: Mapped[int | None] = mapped_column(BigInteger)
    # Why the request read what it read (gateway/cache_explanation.py): the miss reason, and the whole as JSON.
    cache_miss_reason: Mapped[str | None] = mapped_column(String(32))
    cache_explanation: Mapped[str | None] = mapped_column(Text)


class ServerState(Base):
    """Small server-wide values generated once: the salt secret and the admin token's hash."""

    __tablename__ = "server_state"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))
