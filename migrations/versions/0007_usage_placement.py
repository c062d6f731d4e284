"""Where each request ran: usage_records gains backend, engine_id and predicted_cached_tokens.

Revision ID: 0007_usage_placement
Revises: 0006_cache_ttl_classes

With KVGATE_ENGINES a gateway serves through remote engines (issue 16): `backend` says which kind
counted a record's tokens ("embedded", "kvgate", or "vllm", whose cache writes the gateway derives:
gateway/backends/http_wire.py), `engine_id` which engine, and `predicted_cached_tokens` what the
router expected it to read (compared with cache_read_tokens, never billed). All nullable: a record
recovered from the in-flight journal has no engine. Every record before this revision was the
embedded engine's, so they get backend and engine_id "embedded".
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_usage_placement"
down_revision: str | None = "0006_cache_ttl_classes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("backend", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("engine_id", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("predicted_cached_tokens", sa.BigInteger(), nullable=True))
    op.execute("UPDATE usage_records SET backend = 'embedded', engine_id = 'embedded'")


def downgrade() -> None:
    with op.batch_alter_table("usage_records", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("predicted_cached_tokens")
        batch_op.drop_column("engine_id")
        batch_op.drop_column("backend")
