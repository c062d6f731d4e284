"""Billing profiles, and what finalization fixes on an invoice: tax, due date, the parties as they were.

Revision ID: 0004_billing_profiles
Revises: 0003_dashboard

`billing_profiles` holds a tenant's buyer block and tax treatment. Invoices gain `tax_cents`,
`due_on`, `parties_json` (buyer, seller and tax treatment copied at finalization) and
`exact_uncached_pico` (so the savings percentage comes from exact amounts); older
finalized invoices keep NULLs and are shown as they were issued (no tax, no due date).
`stripe_credit_notes` records which credit notes Stripe has. The invoice freeze of 0002 is
extended to the new columns: once finalized, tax, due date and parties never change.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_billing_profiles"
down_revision: str | None = "0003_dashboard"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Timestamp = sa.DateTime(timezone=True)
# 0002's frozen columns, and those this revision adds.
FROZEN_0002 = (
    "tenant_id",
    "period_start",
    "number",
    "currency",
    "requests",
    "total_cents",
    "uncached_cents",
    "finalized_at",
)
FROZEN_0004 = (*FROZEN_0002, "tax_cents", "due_on", "parties_json", "exact_uncached_pico")


def _freeze(columns: Sequence[str]) -> None:
    """(Re)define the invoice freeze of 0002 over `columns`."""
    changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in columns)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            f"""
            CREATE OR REPLACE FUNCTION kvgate_invoice_frozen() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF OLD.status <> 'draft' THEN
                    IF TG_OP = 'DELETE' OR NEW.status = 'draft' OR {changed} THEN
                        RAISE EXCEPTION 'invoice % is finalized and immutable', OLD.id;
                    END IF;
                END IF;
                IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
                RETURN NEW;
            END $$
            """
        )
        return
    op.execute("DROP TRIGGER invoices_frozen")
    op.execute(
        "CREATE TRIGGER invoices_frozen BEFORE UPDATE ON invoices "
        f"WHEN OLD.status <> 'draft' AND (NEW.status = 'draft' OR {changed.replace('IS DISTINCT FROM', 'IS NOT')}) "
        "BEGIN SELECT RAISE(ABORT, 'invoice is finalized and immutable'); END"
    )


def upgrade() -> None:
    op.create_table(
        "billing_profiles",
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("legal_name", sa.String(length=200), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=True),
        sa.Column("address_line1", sa.String(length=200), nullable=True),
        sa.Column("address_line2", sa.String(length=200), nullable=True),
        sa.Column("address_city", sa.String(length=100), nullable=True),
        sa.Column("address_postal_code", sa.String(length=20), nullable=True),
        sa.Column("address_state", sa.String(length=100), nullable=True),
        sa.Column("address_country", sa.String(length=2), nullable=True),
        sa.Column("tax_id_type", sa.String(length=32), nullable=True),
        sa.Column("tax_id_value", sa.String(length=64), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("po_number", sa.String(length=64), nullable=True),
        sa.Column("tax_treatment", sa.String(length=16), nullable=False),
        sa.Column("tax_rate_percent", sa.String(length=40), nullable=True),
        sa.Column("tax_note", sa.String(length=500), nullable=True),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("tenant_id"),
    )
    op.create_table(
        "stripe_credit_notes",
        sa.Column("credit_note_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("stripe_credit_note_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["credit_note_id"], ["credit_notes.id"]),
        sa.PrimaryKeyConstraint("credit_note_id"),
        sa.UniqueConstraint("stripe_credit_note_id"),
    )
    # Plain ADD COLUMN (no table rebuild on SQLite), so the invoice triggers of 0002 stay in place.
    op.add_column("invoices", sa.Column("tax_cents", sa.BigInteger(), nullable=True))
    op.add_column("invoices", sa.Column("due_on", sa.Date(), nullable=True))
    op.add_column("invoices", sa.Column("parties_json", sa.Text(), nullable=True))
    op.add_column("invoices", sa.Column("exact_uncached_pico", sa.BigInteger(), nullable=True))
    _freeze(FROZEN_0004)


def downgrade() -> None:
    _freeze(FROZEN_0002)
    with op.batch_alter_table("invoices", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("exact_uncached_pico")
        batch_op.drop_column("parties_json")
        batch_op.drop_column("due_on")
        batch_op.drop_column("tax_cents")
    op.drop_table("stripe_credit_notes")
    op.drop_table("billing_profiles")
