"""VAT also in EUR (issue 27): the operator's dated exchange rates, and each invoice's VAT in EUR.

Revision ID: 0012_exchange_rates
Revises: 0011_refusals

`exchange_rates` holds EUR per unit of a currency on a date, with its source (billing/exchange_rates.py).
`invoices` gains `vat_eur_json`, set at finalization for an EU seller's invoice with VAT in another
currency (billing/vat_in_eur.py); null on every invoice before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_exchange_rates"
down_revision: str | None = "0011_refusals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0004's frozen invoice columns, and the one this revision adds: the VAT in EUR never changes once issued.
FROZEN_0004 = (
    *("tenant_id", "period_start", "number", "currency", "requests", "total_cents", "uncached_cents"),
    *("finalized_at", "tax_cents", "due_on", "parties_json", "exact_uncached_pico"),
)
FROZEN_0012 = (*FROZEN_0004, "vat_eur_json")


def _freeze(columns: Sequence[str]) -> None:
    """(Re)define the invoice freeze of 0002 and 0004 over `columns`."""
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
        "exchange_rates",
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("rate_date", sa.Date(), nullable=False),
        sa.Column("eur_per_unit", sa.String(length=40), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column("loaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("currency", "rate_date"),
    )
    with op.batch_alter_table("invoices", recreate="never") as table:
        table.add_column(sa.Column("vat_eur_json", sa.Text(), nullable=True))
    _freeze(FROZEN_0012)


def downgrade() -> None:
    _freeze(FROZEN_0004)
    with op.batch_alter_table("invoices", recreate="never") as table:
        table.drop_column("vat_eur_json")
    op.drop_table("exchange_rates")
