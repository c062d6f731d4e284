"""Batches (issue 26): Anthropic Message Batches and OpenAI Batch with its files, and the batch price.

Revision ID: 0009_batches
Revises: 0008_tenant_scheduling_weight

`batches`, `batch_items` (one row per request: params, state, current attempt's request id,
result) and `batch_files` (OpenAI files: uploaded inputs with their bytes, and each batch's
output and error files) belong to their tenant (ON DELETE CASCADE). `usage_records`,
`ledger_entries` and `invoice_lines` gain `batch` (false for every row before), and
`price_versions` gains `batch_multiplier` (0.5 for the versions before it).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_batches"
down_revision: str | None = "0008_tenant_scheduling_weight"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)
FLAG_TABLES = ("usage_records", "ledger_entries", "invoice_lines")


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("api_key_id", sa.String(length=40), nullable=False),
        sa.Column("api", sa.String(length=16), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("cancel_requested_at", Timestamp, nullable=True),
        sa.Column("ended_at", Timestamp, nullable=True),
        sa.Column("request_count", sa.Integer(), nullable=False),
        sa.Column("input_file_id", sa.String(length=64), nullable=True),
        sa.Column("completion_window", sa.String(length=16), nullable=True),
        sa.Column("metadata_json", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_batches_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
    )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.create_index("ix_batches_status", ["status"], unique=False)
        batch_op.create_index("ix_batches_tenant_created", ["tenant_id", "created_at"], unique=False)
    op.create_table(
        "batch_files",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=256), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=True),
        sa.Column("batch_id", sa.String(length=64), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name=op.f("fk_batch_files_batch_id_batches"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_batch_files_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batch_files")),
    )
    with op.batch_alter_table("batch_files", schema=None) as batch_op:
        batch_op.create_index("ix_batch_files_tenant_created", ["tenant_id", "created_at"], unique=False)
    op.create_table(
        "batch_items",
        sa.Column("batch_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(length=64), nullable=False),
        sa.Column("params_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("lease_until", Timestamp, nullable=True),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.Column("result_json", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name=op.f("fk_batch_items_batch_id_batches"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("batch_id", "position", name=op.f("pk_batch_items")),
    )
    with op.batch_alter_table("batch_items", schema=None) as batch_op:
        batch_op.create_index("ix_batch_items_batch_custom_id", ["batch_id", "custom_id"], unique=True)
        batch_op.create_index("ix_batch_items_batch_status", ["batch_id", "status"], unique=False)
    # recreate="never": SQLite adds the columns in place, keeping the ledger's append-only triggers.
    for table in FLAG_TABLES:
        with op.batch_alter_table(table, schema=None, recreate="never") as batch_op:
            batch_op.add_column(sa.Column("batch", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("price_versions", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("batch_multiplier", sa.String(length=40), server_default="0.5", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("price_versions", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("batch_multiplier")
    for table in reversed(FLAG_TABLES):
        with op.batch_alter_table(table, schema=None, recreate="never") as batch_op:
            batch_op.drop_column("batch")
    with op.batch_alter_table("batch_items", schema=None) as batch_op:
        batch_op.drop_index("ix_batch_items_batch_status")
        batch_op.drop_index("ix_batch_items_batch_custom_id")
    op.drop_table("batch_items")
    with op.batch_alter_table("batch_files", schema=None) as batch_op:
        batch_op.drop_index("ix_batch_files_tenant_created")
    op.drop_table("batch_files")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_index("ix_batches_tenant_created")
        batch_op.drop_index("ix_batches_status")
    op.drop_table("batches")
