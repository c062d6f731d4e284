"""Cache explanations in usage records (issue 28): why a request read what it read, and layout findings.

Revision ID: 0014_cache_explanations
Revises: 0012_exchange_rates

`usage_records` gains `cache_miss_reason` ("expired", "evicted", "never_written",
"other_partition"; null when nothing that matched an earlier prompt went unread) and
`cache_explanation`, the whole explanation as JSON text (gateway/cache_explanation.py: the
divergence, the miss, the layout findings). Both are null on every row before, and on rows the
gateway did not explain (refusals, recovered requests).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_cache_explanations"
down_revision: str | None = "0012_exchange_rates"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records", recreate="never") as table:
        table.add_column(sa.Column("cache_miss_reason", sa.String(length=32), nullable=True))
        table.add_column(sa.Column("cache_explanation", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as table:
        table.drop_column("cache_explanation")
        table.drop_column("cache_miss_reason")
