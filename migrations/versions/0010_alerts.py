"""Alerts (issue 27): per-tenant alert settings, webhook endpoints, fired alerts, deliveries and their attempts.

Revision ID: 0010_alerts
Revises: 0009_batches

`alert_events` is unique on (tenant, kind, period), so an alert fires once per period even across
restarts and gateways; its id is the event id every delivery carries. `alert_deliveries` is one row per
alert and target (a webhook endpoint, or the mail recipients), `alert_attempts` one per try. Everything
belongs to its tenant (ON DELETE CASCADE).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_alerts"
down_revision: str | None = "0009_batches"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _tenant_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["tenant_id"], ["tenants.id"], name=op.f(f"fk_{table}_tenant_id_tenants"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "alert_settings",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("kinds", sa.String(length=200), nullable=False),
        sa.Column("email_recipients", sa.Text(), nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        _tenant_fk("alert_settings"),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_alert_settings")),
    )
    op.create_table(
        "alert_endpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("secret", sa.String(length=80), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("removed_at", Timestamp, nullable=True),
        _tenant_fk("alert_endpoints"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_endpoints")),
    )
    with op.batch_alter_table("alert_endpoints", schema=None) as batch_op:
        batch_op.create_index("ix_alert_endpoints_tenant_id", ["tenant_id"], unique=False)
    op.create_table(
        "alert_events",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("period", sa.String(length=200), nullable=False),
        sa.Column("summary", sa.String(length=500), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        _tenant_fk("alert_events"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_events")),
        sa.UniqueConstraint("tenant_id", "kind", "period", name="uq_alert_events_tenant_kind_period"),
    )
    with op.batch_alter_table("alert_events", schema=None) as batch_op:
        batch_op.create_index("ix_alert_events_tenant_created", ["tenant_id", "created_at"], unique=False)
    op.create_table(
        "alert_deliveries",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("channel", sa.String(length=16), nullable=False),
        sa.Column("endpoint_id", sa.String(length=40), nullable=True),
        sa.Column("target", sa.String(length=2048), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", Timestamp, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("delivered_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["alert_endpoints.id"],
            name=op.f("fk_alert_deliveries_endpoint_id_alert_endpoints"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["alert_events.id"],
            name=op.f("fk_alert_deliveries_event_id_alert_events"),
            ondelete="CASCADE",
        ),
        _tenant_fk("alert_deliveries"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_deliveries")),
        sa.UniqueConstraint("event_id", "target", name="uq_alert_deliveries_event_target"),
    )
    with op.batch_alter_table("alert_deliveries", schema=None) as batch_op:
        batch_op.create_index("ix_alert_deliveries_state_next", ["state", "next_attempt_at"], unique=False)
        batch_op.create_index("ix_alert_deliveries_tenant_created", ["tenant_id", "created_at"], unique=False)
    op.create_table(
        "alert_attempts",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("delivery_id", Id, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("finished_at", Timestamp, nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(length=500), nullable=True),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["alert_deliveries.id"],
            name=op.f("fk_alert_attempts_delivery_id_alert_deliveries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_attempts")),
        sa.UniqueConstraint("delivery_id", "attempt", name="uq_alert_attempts_delivery_attempt"),
    )


def downgrade() -> None:
    op.drop_table("alert_attempts")
    with op.batch_alter_table("alert_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_alert_deliveries_tenant_created")
        batch_op.drop_index("ix_alert_deliveries_state_next")
    op.drop_table("alert_deliveries")
    with op.batch_alter_table("alert_events", schema=None) as batch_op:
        batch_op.drop_index("ix_alert_events_tenant_created")
    op.drop_table("alert_events")
    with op.batch_alter_table("alert_endpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_alert_endpoints_tenant_id")
    op.drop_table("alert_endpoints")
    op.drop_table("alert_settings")
