"""Cache TTL classes 30m and 12h: their write-token columns and their price multipliers.

Revision ID: 0006_cache_ttl_classes
Revises: 0005_responses

OpenAI's `prompt_cache_options.ttl` ("30m") and `prompt_cache_breakpoint.ttl` ("30m", "12h")
are billed in their own categories. usage_records, ledger_entries and usage_rollups gain
`cache_write_30m_tokens` and `cache_write_12h_tokens` (0 for every row before: no request
could write those classes). price_versions gains their multipliers; the versions already
stored get the catalog's defaults (1.7 and 5.0), which changes no recorded cost, since no
entry has tokens in those categories.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_cache_ttl_classes"
down_revision: str | None = "0005_responses"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKEN_TABLES = ("usage_records", "ledger_entries", "usage_rollups")
TOKEN_COLUMNS = ("cache_write_30m_tokens", "cache_write_12h_tokens")
# As in billing.prices.DEFAULT_MULTIPLIERS, spelled out: a migration never imports the app.
MULTIPLIERS = {"cache_write_30m_multiplier": "1.7", "cache_write_12h_multiplier": "5.0"}


def upgrade() -> None:
    for table in TOKEN_TABLES:
        with op.batch_alter_table(table, schema=None, recreate="never") as batch_op:
            for name in TOKEN_COLUMNS:
                batch_op.add_column(sa.Column(name, sa.BigInteger(), server_default="0", nullable=False))
    with op.batch_alter_table("price_versions", schema=None, recreate="never") as batch_op:
        for name, default in MULTIPLIERS.items():
            batch_op.add_column(sa.Column(name, sa.String(length=40), server_default=default, nullable=False))


def downgrade() -> None:
    # recreate="never": SQLite drops the columns in place, keeping the append-only triggers.
    with op.batch_alter_table("price_versions", schema=None, recreate="never") as batch_op:
        for name in reversed(MULTIPLIERS):
            batch_op.drop_column(name)
    for table in reversed(TOKEN_TABLES):
        with op.batch_alter_table(table, schema=None, recreate="never") as batch_op:
            for name in reversed(TOKEN_COLUMNS):
                batch_op.drop_column(name)
