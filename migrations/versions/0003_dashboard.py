"""Dashboard: members, login links, browser sessions, key scopes, hourly usage rollups, and the
ledger index the Requests page pages by.

Revision ID: 0003_dashboard
Revises: 0002_billing

Existing keys get the scope "inference", the power they had. The rollups are filled from the
ledger already there, so summaries over old months agree with the ledger from the start.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0003_dashboard"
down_revision: str | None = "0002_billing"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)
ROLLUP_KEY = ("tenant_id", "hour", "api_key_id", "model", "endpoint", "status")
ROLLUP_SUMS = (
    "input_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "cache_write_24h_tokens",
    "cache_read_tokens",
    "output_tokens",
    "cost_pico",
    "uncached_cost_pico",
)


def upgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("scopes", sa.String(length=200), server_default="inference", nullable=False))
    op.create_table(
        "members",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("last_login_at", Timestamp, nullable=True),
        sa.Column("removed_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_members_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_members")),
        sa.UniqueConstraint("tenant_id", "email", name="uq_members_tenant_email"),
    )
    with op.batch_alter_table("members", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_members_tenant_id"), ["tenant_id"], unique=False)
    op.create_table(
        "login_links",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("member_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("used_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["member_id"], ["members.id"], name=op.f("fk_login_links_member_id_members"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_login_links")),
    )
    with op.batch_alter_table("login_links", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_login_links_member_id"), ["member_id"], unique=False)
    op.create_table(
        "web_sessions",
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("member_id", sa.String(length=40), nullable=True),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("revoked_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["member_id"], ["members.id"], name=op.f("fk_web_sessions_member_id_members"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_web_sessions")),
    )
    with op.batch_alter_table("web_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_sessions_member_id"), ["member_id"], unique=False)
    rollups = op.create_table(
        "usage_rollups",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("hour", Timestamp, nullable=False),
        sa.Column("api_key_id", sa.String(length=40), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in ROLLUP_SUMS),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name=op.f("fk_usage_rollups_tenant_id_tenants")),
        sa.PrimaryKeyConstraint(*ROLLUP_KEY, name=op.f("pk_usage_rollups")),
    )
    with op.batch_alter_table("usage_rollups", schema=None) as batch_op:
        batch_op.create_index("ix_usage_rollups_hour", ["hour"], unique=False)
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.create_index("ix_ledger_entries_tenant_id_id", ["tenant_id", "id"], unique=False)
    _backfill_rollups(rollups)


def _as_hour(value: datetime | str) -> datetime:
    if isinstance(value, str):  # SQLite hands back text
        value = datetime.fromisoformat(value)
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.replace(minute=0, second=0, microsecond=0)


def _backfill_rollups(rollups: sa.Table) -> None:
    connection = op.get_bind()
    ledger = sa.table(
        "ledger_entries",
        sa.column("kind"),
        sa.column("started_at"),
        *(sa.column(name) for name in ROLLUP_KEY if name != "hour"),
        *(sa.column(name) for name in ROLLUP_SUMS),
    )
    sums: dict[tuple[object, ...], dict[str, int]] = {}
    for row in connection.execute(sa.select(ledger)).mappings():
        key = (
            row["tenant_id"],
            _as_hour(row["started_at"]),
            row["api_key_id"] or "",
            row["model"],
            row["endpoint"],
            row["status"],
        )
        total = sums.setdefault(key, dict.fromkeys(("requests", *ROLLUP_SUMS), 0))
        total["requests"] += 1 if row["kind"] == "usage" else 0
        for name in ROLLUP_SUMS:
            total[name] += row[name]
    if sums:
        op.bulk_insert(rollups, [dict(zip(ROLLUP_KEY, key, strict=True)) | total for key, total in sums.items()])


def downgrade() -> None:
    with op.batch_alter_table("ledger_entries", schema=None) as batch_op:
        batch_op.drop_index("ix_ledger_entries_tenant_id_id")
    with op.batch_alter_table("usage_rollups", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_rollups_hour")
    op.drop_table("usage_rollups")
    with op.batch_alter_table("web_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_web_sessions_member_id"))
    op.drop_table("web_sessions")
    with op.batch_alter_table("login_links", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_login_links_member_id"))
    op.drop_table("login_links")
    with op.batch_alter_table("members", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_members_tenant_id"))
    op.drop_table("members")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("scopes")
