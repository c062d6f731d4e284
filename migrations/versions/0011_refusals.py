"""Refusals as usage records (issue 27): a request refused for a rate limit or a budget leaves a usage record.

Revision ID: 0011_refusals
Revises: 0010_alerts

`usage_records` gains `refusal_reason` (the limit: "rate_limit", "tenant_month", "key_month",
"tenant_credit") and `refusal_reserve_pico` (the worst-case cost that did not fit a budget), both
null on every row before and on every request that ran. The rows carry status "refused" and no tokens;
they never reach the ledger. An index on (tenant_id, status, started_at) finds a tenant's refusals by time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_refusals"
down_revision: str | None = "0010_alerts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records", recreate="never") as table:
        table.add_column(sa.Column("refusal_reason", sa.String(length=32), nullable=True))
        table.add_column(sa.Column("refusal_reserve_pico", sa.BigInteger(), nullable=True))
    op.create_index("ix_usage_records_tenant_status_started", "usage_records", ["tenant_id", "status", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_usage_records_tenant_status_started", table_name="usage_records")
    with op.batch_alter_table("usage_records") as table:
        table.drop_column("refusal_reserve_pico")
        table.drop_column("refusal_reason")
