"""tenants gains scheduling_weight: its share of the engine when tenants contend (issue 25).

Revision ID: 0008_tenant_scheduling_weight
Revises: 0007_usage_placement

The engine serves contending tenants' waiting requests and prefill budget by deficit round
robin, in proportion to this weight (inference/scheduler.py). Every tenant starts at 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_tenant_scheduling_weight"
down_revision: str | None = "0007_usage_placement"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("scheduling_weight", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("tenants", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("scheduling_weight")
